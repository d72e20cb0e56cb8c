//! Toxic definitions shared by the server and the client.
//!
//! A toxic is described in Toxiproxy's JSON shape (`name`, `type`, `stream`,
//! `toxicity`, `attributes`). This module owns the typed form of that shape,
//! its JSON encoding, and the validation that the server applies to input, so
//! that server and client can never disagree about attribute names or units.

use serde_json::{Map, Value};
use std::fmt;

/// Which direction of a connection a toxic applies to.
///
/// Toxiproxy's terms: `upstream` is client → server, `downstream` is
/// server → client (the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Stream {
    /// Client → server.
    Upstream,
    /// Server → client.
    #[default]
    Downstream,
}

impl Stream {
    /// Toxiproxy's name for this stream.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Upstream => "upstream",
            Stream::Downstream => "downstream",
        }
    }

    /// Parses Toxiproxy's stream names.
    pub fn parse(text: &str) -> Option<Stream> {
        match text {
            "upstream" => Some(Stream::Upstream),
            "downstream" => Some(Stream::Downstream),
            _ => None,
        }
    }
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of a toxic and its attributes, in Toxiproxy's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToxicKind {
    /// Passes data through unchanged.
    Noop,
    /// Delays each chunk by `latency_ms` ± `jitter_ms`.
    Latency { latency_ms: u64, jitter_ms: u64 },
    /// Limits throughput to `rate_kbps` kilobytes (1000 bytes) per second; 0 holds
    /// all data until the toxic is removed or changed (as in Toxiproxy).
    Bandwidth { rate_kbps: u64 },
    /// Delays the close (FIN) by `delay_ms`.
    SlowClose { delay_ms: u64 },
    /// Drops all data; closes the connection after `timeout_ms` without data (0:
    /// never), at once when the source ends, and when the toxic is removed.
    Timeout { timeout_ms: u64 },
    /// On the first data, waits `timeout_ms` then resets the connection (RST).
    ResetPeer { timeout_ms: u64 },
    /// Splits chunks into slices of `average_size` ± `size_variation` bytes, `delay_us` apart.
    Slicer { average_size_bytes: u64, size_variation_bytes: u64, delay_us: u64 },
    /// Passes `bytes` bytes, then closes the connection.
    LimitData { bytes: u64 },
    /// fencelab's own (Toxiproxy has no such toxic): on a PostgreSQL client's stream,
    /// passes data up to and including the first simple-query `COMMIT` message of a chunk,
    /// then closes the connection. The server commits; its answer never reaches the
    /// client, who cannot tell whether the transaction committed. With `distinct`, only
    /// the first COMMIT of each kind of transaction (the statements it ran) is cut, over
    /// every connection of the proxy: a few cuts then reach every kind of write, not the
    /// most frequent one again and again.
    CommitCut { distinct: bool },
    /// fencelab's own: a one-sided reset. The connections open when the toxic is added (or,
    /// when none is, the first one accepted after, once it has carried the client's first
    /// bytes) have their upstream side, the proxy's socket to the server, reset (RST),
    /// while their downstream side, the client's, stays open and silent: the proxy reads
    /// and discards what the client sends and sends it nothing until the toxic is removed,
    /// then closes it. Connections accepted later pass normally. Acts on whole connections
    /// whatever its stream.
    ResetUpstream,
    /// fencelab's own: as [`ToxicKind::ResetUpstream`] with the sides swapped: the client's
    /// side reset, the server's kept open and silent.
    ResetDownstream,
}

/// Why a toxic or its attributes were rejected. The messages of the first two
/// are Toxiproxy's own, word for word; the others name the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToxicInputError {
    /// The type is missing or unknown (the variant keeps what was given).
    #[error("invalid toxic type")]
    UnknownType(String),
    #[error("stream was invalid, can be either upstream or downstream")]
    InvalidStream,
    #[error("{0}")]
    Invalid(String),
}

/// Attribute names of each toxic type. As in Toxiproxy, every attribute is
/// optional and defaults to 0 (an update keeps the current value instead).
fn attribute_names(type_name: &str) -> Option<&'static [&'static str]> {
    Some(match type_name {
        "noop" => &[],
        "latency" => &["latency", "jitter"],
        "bandwidth" => &["rate"],
        "slow_close" => &["delay"],
        "timeout" => &["timeout"],
        "reset_peer" => &["timeout"],
        "slicer" => &["average_size", "size_variation", "delay"],
        "limit_data" => &["bytes"],
        "commit_cut" => &["distinct"],
        "reset_upstream" | "reset_downstream" => &[],
        _ => return None,
    })
}

impl ToxicKind {
    /// Toxiproxy's type name.
    pub fn type_name(&self) -> &'static str {
        match self {
            ToxicKind::Noop => "noop",
            ToxicKind::Latency { .. } => "latency",
            ToxicKind::Bandwidth { .. } => "bandwidth",
            ToxicKind::SlowClose { .. } => "slow_close",
            ToxicKind::Timeout { .. } => "timeout",
            ToxicKind::ResetPeer { .. } => "reset_peer",
            ToxicKind::Slicer { .. } => "slicer",
            ToxicKind::LimitData { .. } => "limit_data",
            ToxicKind::CommitCut { .. } => "commit_cut",
            ToxicKind::ResetUpstream => "reset_upstream",
            ToxicKind::ResetDownstream => "reset_downstream",
        }
    }

    /// Attribute values in Toxiproxy's order and names.
    pub fn attributes(&self) -> Vec<(&'static str, u64)> {
        match *self {
            ToxicKind::Noop => vec![],
            ToxicKind::Latency { latency_ms, jitter_ms } => vec![("latency", latency_ms), ("jitter", jitter_ms)],
            ToxicKind::Bandwidth { rate_kbps } => vec![("rate", rate_kbps)],
            ToxicKind::SlowClose { delay_ms } => vec![("delay", delay_ms)],
            ToxicKind::Timeout { timeout_ms } => vec![("timeout", timeout_ms)],
            ToxicKind::ResetPeer { timeout_ms } => vec![("timeout", timeout_ms)],
            ToxicKind::Slicer { average_size_bytes, size_variation_bytes, delay_us } => vec![
                ("average_size", average_size_bytes),
                ("size_variation", size_variation_bytes),
                ("delay", delay_us),
            ],
            ToxicKind::LimitData { bytes } => vec![("bytes", bytes)],
            ToxicKind::CommitCut { distinct } => vec![("distinct", u64::from(distinct))],
            ToxicKind::ResetUpstream | ToxicKind::ResetDownstream => vec![],
        }
    }

    /// Whether the toxic acts on whole connections, one side reset and the other kept
    /// silent ([`ToxicKind::ResetUpstream`], [`ToxicKind::ResetDownstream`]), rather than
    /// on a stream's data.
    pub fn is_one_sided(&self) -> bool {
        matches!(self, ToxicKind::ResetUpstream | ToxicKind::ResetDownstream)
    }

    /// Attributes as a JSON object.
    pub fn attributes_json(&self) -> Value {
        let map: Map<String, Value> =
            self.attributes().into_iter().map(|(k, v)| (k.to_string(), Value::from(v))).collect();
        Value::Object(map)
    }

    /// Builds a kind from a type name and a full attribute table.
    fn from_values(type_name: &str, get: impl Fn(&str) -> u64) -> Result<Self, ToxicInputError> {
        let kind = match type_name {
            "noop" => ToxicKind::Noop,
            "latency" => ToxicKind::Latency { latency_ms: get("latency"), jitter_ms: get("jitter") },
            "bandwidth" => ToxicKind::Bandwidth { rate_kbps: get("rate") },
            "slow_close" => ToxicKind::SlowClose { delay_ms: get("delay") },
            "timeout" => ToxicKind::Timeout { timeout_ms: get("timeout") },
            "reset_peer" => ToxicKind::ResetPeer { timeout_ms: get("timeout") },
            "slicer" => ToxicKind::Slicer {
                average_size_bytes: get("average_size"),
                size_variation_bytes: get("size_variation"),
                delay_us: get("delay"),
            },
            "limit_data" => ToxicKind::LimitData { bytes: get("bytes") },
            "commit_cut" => match get("distinct") {
                0 => ToxicKind::CommitCut { distinct: false },
                1 => ToxicKind::CommitCut { distinct: true },
                other => {
                    return Err(ToxicInputError::Invalid(format!(
                        "bad request body: attribute distinct must be 0 or 1, got {other}"
                    )))
                }
            },
            "reset_upstream" => ToxicKind::ResetUpstream,
            "reset_downstream" => ToxicKind::ResetDownstream,
            other => return Err(ToxicInputError::UnknownType(other.to_string())),
        };
        Ok(kind)
    }

    /// Parses attributes for `type_name` (`null` or absent: none given); with
    /// `base`, unspecified attributes keep the base's values (update), otherwise
    /// they are 0, as in Toxiproxy.
    pub fn parse(
        type_name: &str,
        attributes: Option<&Value>,
        base: Option<&ToxicKind>,
    ) -> Result<Self, ToxicInputError> {
        let names = attribute_names(type_name).ok_or_else(|| ToxicInputError::UnknownType(type_name.to_string()))?;
        let given = match attributes {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(map)) => map.clone(),
            Some(_) => {
                return Err(ToxicInputError::Invalid("bad request body: attributes must be a JSON object".into()))
            }
        };
        let base_values: Vec<(&str, u64)> = base.map(|b| b.attributes()).unwrap_or_default();
        let mut values: Vec<(&str, u64)> = Vec::with_capacity(names.len());
        for &name in names {
            let value = match given.get(name) {
                Some(v) if !v.is_null() => attribute_value(name, v)?,
                // Absent or null: Toxiproxy's JSON decoding leaves the field as it was.
                _ => base_values.iter().find(|(n, _)| *n == name).map_or(0, |&(_, v)| v),
            };
            values.push((name, value));
        }
        let get = |name: &str| values.iter().find(|(n, _)| *n == name).map_or(0, |&(_, v)| v);
        ToxicKind::from_values(type_name, get)
    }
}

/// Reads one attribute: a non-negative integer (Toxiproxy's int64 fields).
fn attribute_value(name: &str, value: &Value) -> Result<u64, ToxicInputError> {
    if let Some(v) = value.as_u64() {
        return Ok(v);
    }
    // Accept integral floats such as 100.0, which some clients send.
    if let Some(f) = value.as_f64() {
        if f >= 0.0 && f.fract() == 0.0 && f <= u64::MAX as f64 {
            return Ok(f as u64);
        }
    }
    Err(ToxicInputError::Invalid(format!(
        "bad request body: attribute {name} must be a non-negative integer, got {value}"
    )))
}

/// A toxic as configured on a proxy.
#[derive(Debug, Clone, PartialEq)]
pub struct Toxic {
    /// Unique per proxy across both streams; defaults to `<type>_<stream>`.
    pub name: String,
    /// Type and attributes.
    pub kind: ToxicKind,
    /// Direction it applies to.
    pub stream: Stream,
    /// Probability (0..=1) that the toxic applies to a given connection.
    pub toxicity: f32,
}

impl Toxic {
    /// A toxic of `kind` on the downstream stream with toxicity 1 and the default name.
    pub fn new(kind: ToxicKind) -> Self {
        Toxic {
            name: default_name(kind.type_name(), Stream::Downstream),
            kind,
            stream: Stream::Downstream,
            toxicity: 1.0,
        }
    }

    /// Sets the stream; a default name follows the stream.
    pub fn on(mut self, stream: Stream) -> Self {
        if self.name == default_name(self.kind.type_name(), self.stream) {
            self.name = default_name(self.kind.type_name(), stream);
        }
        self.stream = stream;
        self
    }

    /// Sets the name.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the toxicity (probability per connection).
    pub fn with_toxicity(mut self, toxicity: f32) -> Self {
        self.toxicity = toxicity;
        self
    }

    /// Toxiproxy's JSON shape.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "name": self.name,
            "type": self.kind.type_name(),
            "stream": self.stream.as_str(),
            "toxicity": toxicity_json(self.toxicity),
            "attributes": self.kind.attributes_json(),
        })
    }

    /// Parses a create request body (already decoded as JSON).
    pub fn from_create_json(body: &Value) -> Result<Toxic, ToxicInputError> {
        CreateHead::parse(body)?.with_attributes(body)
    }

    /// Applies an update body: merges attributes and toxicity, keeps the rest.
    pub fn merged_with(&self, body: &Value) -> Result<Toxic, ToxicInputError> {
        let obj = body.as_object().ok_or_else(|| ToxicInputError::Invalid(NOT_AN_OBJECT.into()))?;
        let kind = ToxicKind::parse(self.kind.type_name(), obj.get("attributes"), Some(&self.kind))?;
        let toxicity = parse_toxicity(obj.get("toxicity"))?.unwrap_or(self.toxicity);
        Ok(Toxic { kind, toxicity, ..self.clone() })
    }
}

const NOT_AN_OBJECT: &str = "bad request body: toxic must be a JSON object";

/// The fields of a create request other than the attributes, checked in
/// Toxiproxy's order (stream, then type), so that the server can answer a name
/// conflict before it judges the attributes, as Toxiproxy does.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateHead {
    pub name: String,
    pub type_name: &'static str,
    pub stream: Stream,
    pub toxicity: f32,
}

impl CreateHead {
    /// Reads stream, type, name and toxicity; a missing, empty or unknown type
    /// is Toxiproxy's `invalid toxic type`.
    pub fn parse(body: &Value) -> Result<CreateHead, ToxicInputError> {
        let obj = body.as_object().ok_or_else(|| ToxicInputError::Invalid(NOT_AN_OBJECT.into()))?;
        let stream = parse_stream(obj.get("stream"))?;
        let given_type = match obj.get("type") {
            Some(Value::String(s)) => s.as_str(),
            None | Some(Value::Null) => "",
            Some(other) => return Err(ToxicInputError::UnknownType(other.to_string())),
        };
        let type_name = KNOWN_TYPES
            .iter()
            .find(|t| **t == given_type)
            .ok_or_else(|| ToxicInputError::UnknownType(given_type.to_string()))?;
        let toxicity = parse_toxicity(obj.get("toxicity"))?.unwrap_or(1.0);
        let name = match obj.get("name") {
            None | Some(Value::Null) => default_name(type_name, stream),
            Some(Value::String(s)) if s.is_empty() => default_name(type_name, stream),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(ToxicInputError::Invalid("bad request body: name must be a string".into())),
        };
        Ok(CreateHead { name, type_name, stream, toxicity })
    }

    /// Completes the toxic with the body's attributes (`null` or absent: all 0).
    pub fn with_attributes(self, body: &Value) -> Result<Toxic, ToxicInputError> {
        let kind = ToxicKind::parse(self.type_name, body.get("attributes"), None)?;
        Ok(Toxic { name: self.name, kind, stream: self.stream, toxicity: self.toxicity })
    }
}

/// Every toxic type this server knows.
const KNOWN_TYPES: [&str; 11] = [
    "noop",
    "latency",
    "bandwidth",
    "slow_close",
    "timeout",
    "reset_peer",
    "slicer",
    "limit_data",
    "commit_cut",
    "reset_upstream",
    "reset_downstream",
];

/// A toxicity as JSON, printed as its shortest decimal (0.2, not 0.20000000298…),
/// as Toxiproxy's float32 encoding prints it.
fn toxicity_json(toxicity: f32) -> Value {
    let shortest: f64 = toxicity.to_string().parse().unwrap_or(f64::from(toxicity));
    Value::from(shortest)
}

/// Toxiproxy's default toxic name.
pub fn default_name(type_name: &str, stream: Stream) -> String {
    format!("{type_name}_{stream}")
}

/// Toxiproxy's stream rules: absent or null is downstream, the names are
/// case-insensitive, anything else (the empty string too) is invalid.
fn parse_stream(value: Option<&Value>) -> Result<Stream, ToxicInputError> {
    match value {
        None | Some(Value::Null) => Ok(Stream::Downstream),
        Some(Value::String(s)) => Stream::parse(&s.to_ascii_lowercase()).ok_or(ToxicInputError::InvalidStream),
        Some(_) => Err(ToxicInputError::InvalidStream),
    }
}

fn parse_toxicity(value: Option<&Value>) -> Result<Option<f32>, ToxicInputError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(t) if (0.0..=1.0).contains(&t) => Ok(Some(t as f32)),
            _ => Err(ToxicInputError::Invalid(format!(
                "bad request body: toxicity must be a number between 0 and 1, got {v}"
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_name_stream_and_toxicity() {
        let t = Toxic::from_create_json(&json!({"type": "latency", "attributes": {"latency": 5}})).unwrap();
        assert_eq!(t.name, "latency_downstream");
        assert_eq!(t.stream, Stream::Downstream);
        assert_eq!(t.toxicity, 1.0);
        assert_eq!(t.kind, ToxicKind::Latency { latency_ms: 5, jitter_ms: 0 });
    }

    #[test]
    fn rejects_bad_input_naming_the_field() {
        let cases = [
            (json!({"type": "nope"}), "invalid toxic type"),
            (json!({"type": 5}), "invalid toxic type"),
            (json!({"type": "latency", "stream": "sideways"}), "stream"),
            (json!({"type": "latency", "stream": ""}), "stream"),
            (json!({"type": "latency", "attributes": {"latency": -1}}), "latency"),
            (json!({"type": "bandwidth", "attributes": {"rate": "fast"}}), "rate"),
            (json!({"type": "noop", "toxicity": 1.5}), "toxicity"),
        ];
        for (body, field) in cases {
            let err = Toxic::from_create_json(&body).unwrap_err().to_string();
            assert!(err.contains(field), "{body}: {err}");
        }
    }

    #[test]
    fn unknown_or_missing_type_is_toxiproxys_exact_message() {
        for body in [json!({"type": "earthquake"}), json!({"attributes": {}}), json!({"type": ""})] {
            assert_eq!(Toxic::from_create_json(&body).unwrap_err().to_string(), "invalid toxic type");
        }
    }

    #[test]
    fn null_or_missing_attributes_are_zero() {
        for body in [json!({"type": "timeout"}), json!({"type": "timeout", "attributes": null})] {
            assert_eq!(Toxic::from_create_json(&body).unwrap().kind, ToxicKind::Timeout { timeout_ms: 0 });
        }
        let t = Toxic::from_create_json(&json!({"type": "latency", "attributes": {"jitter": null}})).unwrap();
        assert_eq!(t.kind, ToxicKind::Latency { latency_ms: 0, jitter_ms: 0 });
        let t = Toxic::from_create_json(&json!({"type": "latency", "stream": "UpStream"})).unwrap();
        assert_eq!((t.stream, t.name.as_str()), (Stream::Upstream, "latency_upstream"));
    }

    #[test]
    fn toxicity_prints_its_shortest_decimal() {
        let t = Toxic::new(ToxicKind::Noop).with_toxicity(0.2);
        assert_eq!(t.to_json()["toxicity"].to_string(), "0.2");
    }

    #[test]
    fn update_merges_attributes() {
        let t = Toxic::new(ToxicKind::Latency { latency_ms: 100, jitter_ms: 10 });
        let u = t.merged_with(&json!({"attributes": {"latency": 1000}})).unwrap();
        assert_eq!(u.kind, ToxicKind::Latency { latency_ms: 1000, jitter_ms: 10 });
        let v = u.merged_with(&json!({"toxicity": 0.5})).unwrap();
        assert_eq!(v.toxicity, 0.5);
        assert_eq!(v.kind, u.kind);
        let w = v.merged_with(&json!({"attributes": null})).unwrap();
        assert_eq!(w, v);
    }

    #[test]
    fn json_round_trip() {
        let t = Toxic::new(ToxicKind::Slicer { average_size_bytes: 10, size_variation_bytes: 2, delay_us: 5 })
            .on(Stream::Upstream)
            .with_toxicity(0.25);
        assert_eq!(t.name, "slicer_upstream");
        let back = Toxic::from_create_json(&t.to_json()).unwrap();
        assert_eq!(back, t);
    }
}
