//! Reading a request body as the contract says: JSON syntax is judged on the whole body
//! first (`malformed_json`), then its shape (`invalid_body`), and every struct — the body
//! and any nested one — only from a JSON object.
//!
//! serde's derived structs also read a JSON array of their fields in order (`[2, 0]` for
//! `{"steps": 2, "step_ms": 0}`), and a typed parse stops at the first wrong type even when
//! the text after it is not JSON at all; neither is what the wire allows.

use serde::de::{DeserializeOwned, Deserializer, IgnoredAny, Visitor};
use serde::Deserialize;

/// Why a body is not the request it should be.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// Not JSON: a syntax error, truncation, an empty body, invalid UTF-8, trailing characters.
    #[error("request body is not JSON: {0}")]
    Malformed(String),
    /// JSON, but not the request's shape: a non-object, an unknown, duplicate or missing
    /// field, a wrong type or an unknown enum value.
    #[error("request body: {0}")]
    Invalid(String),
}

/// Parses a request body: syntax over the whole body first, then the shape of `T`.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BodyError> {
    let text = std::str::from_utf8(bytes).map_err(|error| BodyError::Malformed(error.to_string()))?;
    serde_json::from_str::<IgnoredAny>(text).map_err(|error| BodyError::Malformed(error.to_string()))?;
    let mut json = serde_json::Deserializer::from_str(text);
    let parsed = object(&mut json).map_err(|error| BodyError::Invalid(error.to_string()))?;
    json.end().map_err(|error| BodyError::Malformed(error.to_string()))?;
    Ok(parsed)
}

/// Deserializes a struct only from a map (a JSON object), never from a sequence. Used for
/// the body itself and, as `#[serde(deserialize_with = "object")]`, for nested structs.
pub fn object<'de, D: Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<T, D::Error> {
    T::deserialize(ObjectOnly(deserializer))
}

/// A deserializer that reads a struct as a map and hands everything else on unchanged.
struct ObjectOnly<D>(D);

impl<'de, D: Deserializer<'de>> Deserializer<'de> for ObjectOnly<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_map(visitor)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_map(visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CreateProject, HeartbeatRequest, StepRequest, SubmitJob};

    fn invalid<T: DeserializeOwned + std::fmt::Debug>(body: &str) -> String {
        match parse::<T>(body.as_bytes()) {
            Err(BodyError::Invalid(why)) => why,
            other => panic!("{body}: expected invalid_body, got {other:?}"),
        }
    }

    fn malformed<T: DeserializeOwned + std::fmt::Debug>(body: &[u8]) {
        match parse::<T>(body) {
            Err(BodyError::Malformed(_)) => {}
            other => panic!("{}: expected malformed_json, got {other:?}", String::from_utf8_lossy(body)),
        }
    }

    #[test]
    fn a_struct_is_read_from_an_object_only() {
        invalid::<CreateProject>(r#"["p1"]"#);
        invalid::<HeartbeatRequest>(r#"["j1", "j1-a1", "r1", 1, 0]"#);
        let why = invalid::<SubmitJob>(r#"{"project": "p", "deployment_key": "k", "spec": [2, 0]}"#);
        assert!(why.contains("expected struct JobSpec"), "{why}");
        let capability = r#"["k", "j1", "j1-a1", "r1", 1, 0, "00"]"#;
        invalid::<StepRequest>(&format!(r#"{{"capability": {capability}, "step": 0, "steps": 1, "duration_ms": 0}}"#));
        let job: SubmitJob =
            parse(br#"{"project": "p", "deployment_key": "k", "spec": {"steps": 2, "step_ms": 0}}"#).unwrap();
        assert_eq!((job.spec.steps, job.spec.step_ms), (2, 0));
    }

    #[test]
    fn syntax_is_judged_on_the_whole_body_before_its_shape() {
        malformed::<CreateProject>(br#"{"id": 5"#);
        malformed::<CreateProject>(br#"[1, 2"#);
        malformed::<CreateProject>(br#"{"id": "p"} {"id": "q"}"#);
        malformed::<CreateProject>(b"{\"id\": 5, \"x\": \"\xff\"}");
        malformed::<HeartbeatRequest>(br#"{"job": "j", "attempt": "a", "runner": "r", "fence": +1, "observed_ms": 0}"#);
        malformed::<CreateProject>(b"");
        invalid::<CreateProject>(r#"{"id": 5}"#);
        invalid::<CreateProject>(r#"{"id": "p", "id": "q"}"#);
    }
}
