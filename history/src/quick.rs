//! A shortcut for the lines a recorder writes: a flat JSON object of the event's own fields,
//! strings without escapes, whole numbers. [`event`] reads such a line in one pass over its
//! bytes and answers `None` for anything else — an escape, a key it does not know or has
//! seen already, a number with a fraction or exponent, a missing required field, bytes
//! after the object — and [`crate::parse_line`] then reads the line with serde_json. So
//! every line the shortcut does not take, and every error a line earns, is serde_json's,
//! and a line the shortcut does take gives the event serde_json gives (a differential test
//! holds it to that over generated and mutated lines). `value` is handed to serde_json
//! whole, once its extent is found.
//!
//! Why: at 10^7 events serde_json spent a third of the time of `fencelab check` on the
//! field names alone (each parsed as a string, checked for escapes and UTF-8, then
//! matched).

use crate::event::{Decision, Event, EventType};
use crate::vocab::{Op, Process};

/// The event `line` holds, when it is of the plain shape described above; `None` sends the
/// line to serde_json.
pub(crate) fn event(line: &[u8]) -> Option<Event> {
    std::str::from_utf8(line).ok()?;
    let mut at = Cursor { bytes: line, at: 0 };
    at.blank();
    at.eat(b'{')?;
    let mut fields = Fields::default();
    let mut seen = 0u32;
    at.blank();
    if at.peek()? == b'}' {
        return None;
    }
    loop {
        at.blank();
        let key = at.plain_string()?;
        at.blank();
        at.eat(b':')?;
        at.blank();
        let field = FIELDS.iter().position(|name| name.as_bytes() == key)?;
        if seen & (1 << field) != 0 {
            return None;
        }
        seen |= 1 << field;
        fields.read(field, &mut at)?;
        at.blank();
        match at.next()? {
            b',' => continue,
            b'}' => break,
            _ => return None,
        }
    }
    at.blank();
    if at.at != line.len() {
        return None;
    }
    fields.event()
}

/// The event's keys, in the order of [`Fields::read`]'s arms.
const FIELDS: [&str; 18] = [
    "index",
    "time_ns",
    "process",
    "type",
    "f",
    "project",
    "job",
    "attempt",
    "runner",
    "fence",
    "key",
    "received_ms",
    "observed_ms",
    "lease_expires_ms",
    "decision",
    "reason",
    "outcome",
    "value",
];

/// The fields read so far.
#[derive(Default)]
struct Fields {
    index: Option<u64>,
    time_ns: Option<u64>,
    process: Option<Process>,
    kind: Option<EventType>,
    f: Option<Op>,
    project: Option<String>,
    job: Option<String>,
    attempt: Option<String>,
    runner: Option<String>,
    fence: Option<u64>,
    key: Option<String>,
    received_ms: Option<i64>,
    observed_ms: Option<i64>,
    lease_expires_ms: Option<i64>,
    decision: Option<Decision>,
    reason: Option<String>,
    outcome: Option<String>,
    value: Option<serde_json::Value>,
}

impl Fields {
    /// Reads the value of field `field` (its place in [`FIELDS`]).
    fn read(&mut self, field: usize, at: &mut Cursor) -> Option<()> {
        match field {
            0 => self.index = Some(at.whole()?),
            1 => self.time_ns = Some(at.whole()?),
            2 => self.process = Some(Process::parse(at.plain_str()?).ok()?),
            3 => self.kind = Some(event_type(at.plain_string()?)?),
            4 => self.f = Some(Op::parse(at.plain_str()?)?),
            5 => self.project = at.nullable(Cursor::owned)?,
            6 => self.job = at.nullable(Cursor::owned)?,
            7 => self.attempt = at.nullable(Cursor::owned)?,
            8 => self.runner = at.nullable(Cursor::owned)?,
            9 => self.fence = at.nullable(Cursor::whole)?,
            10 => self.key = at.nullable(Cursor::owned)?,
            11 => self.received_ms = at.nullable(Cursor::signed)?,
            12 => self.observed_ms = at.nullable(Cursor::signed)?,
            13 => self.lease_expires_ms = at.nullable(Cursor::signed)?,
            14 => self.decision = at.nullable(|at| decision(at.plain_string()?))?,
            15 => self.reason = at.nullable(Cursor::owned)?,
            16 => self.outcome = at.nullable(Cursor::owned)?,
            _ => self.value = at.nullable(Cursor::json)?,
        }
        Some(())
    }

    fn event(self) -> Option<Event> {
        Some(Event {
            index: self.index.unwrap_or(0),
            time_ns: self.time_ns?,
            process: self.process?,
            kind: self.kind?,
            f: self.f?,
            project: self.project,
            job: self.job,
            attempt: self.attempt,
            runner: self.runner,
            fence: self.fence,
            key: self.key,
            received_ms: self.received_ms,
            observed_ms: self.observed_ms,
            lease_expires_ms: self.lease_expires_ms,
            decision: self.decision,
            reason: self.reason,
            outcome: self.outcome,
            value: self.value,
        })
    }
}

fn event_type(word: &[u8]) -> Option<EventType> {
    Some(match word {
        b"invoke" => EventType::Invoke,
        b"ok" => EventType::Ok,
        b"fail" => EventType::Fail,
        b"info" => EventType::Info,
        b"request" => EventType::Request,
        b"response" => EventType::Response,
        b"ledger" => EventType::Ledger,
        b"step" => EventType::Step,
        _ => return None,
    })
}

fn decision(word: &[u8]) -> Option<Decision> {
    Some(match word {
        b"accepted" => Decision::Accepted,
        b"rejected" => Decision::Rejected,
        b"duplicate" => Decision::Duplicate,
        b"conflict" => Decision::Conflict,
        _ => return None,
    })
}

/// A place in a line known to be UTF-8.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.next()? == byte).then_some(())
    }

    /// Skips JSON's white space.
    fn blank(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// A string with no escape and no control character, without its quotes.
    fn plain_string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.at;
        loop {
            match self.next()? {
                b'"' => return Some(&self.bytes[start..self.at - 1]),
                b'\\' | 0..=0x1f => return None,
                _ => {}
            }
        }
    }

    fn plain_str(&mut self) -> Option<&'a str> {
        // The line is UTF-8 and a string ends at an ASCII quote: the bytes between are too.
        std::str::from_utf8(self.plain_string()?).ok()
    }

    fn owned(&mut self) -> Option<String> {
        self.plain_str().map(str::to_string)
    }

    /// `null` as `None`, else what `read` reads.
    fn nullable<T>(&mut self, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.bytes[self.at..].starts_with(b"null") {
            self.at += 4;
            return Some(None);
        }
        read(self).map(Some)
    }

    /// The digits of a whole number, which must end there (no fraction, no exponent) and
    /// not start with a needless zero.
    fn digits(&mut self) -> Option<&'a [u8]> {
        let start = self.at;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
        let digits = &self.bytes[start..self.at];
        let ends = !matches!(self.peek(), Some(b'.' | b'e' | b'E'));
        let plain = !digits.is_empty() && (digits.len() == 1 || digits[0] != b'0');
        (ends && plain).then_some(digits)
    }

    fn whole(&mut self) -> Option<u64> {
        let digits = self.digits()?;
        digits.iter().try_fold(0u64, |sum, &digit| sum.checked_mul(10)?.checked_add(u64::from(digit - b'0')))
    }

    fn signed(&mut self) -> Option<i64> {
        let negative = self.peek()? == b'-';
        if negative {
            self.at += 1;
        }
        let magnitude = i64::try_from(self.whole()?).ok()?;
        Some(if negative { -magnitude } else { magnitude })
    }

    /// Any JSON value, read by serde_json once its extent is found (strings skipped whole,
    /// brackets counted).
    fn json(&mut self) -> Option<serde_json::Value> {
        let start = self.at;
        let mut depth = 0usize;
        loop {
            match self.peek()? {
                b'"' => {
                    self.at += 1;
                    loop {
                        match self.next()? {
                            b'\\' => self.at += 1,
                            b'"' => break,
                            _ => {}
                        }
                    }
                    if depth == 0 {
                        break;
                    }
                }
                // Deeper than serde_json reads inside a line: its error is its own to give.
                b'{' | b'[' if depth >= 100 => return None,
                b'{' | b'[' => {
                    depth += 1;
                    self.at += 1;
                }
                b'}' | b']' if depth > 0 => {
                    depth -= 1;
                    self.at += 1;
                    if depth == 0 {
                        break;
                    }
                }
                b',' | b'}' | b']' if depth == 0 => break,
                _ => self.at += 1,
            }
        }
        serde_json::from_slice(self.bytes.get(start..self.at)?).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serde(line: &str) -> Result<Event, String> {
        serde_json::from_str::<Event>(line).map_err(|error| error.to_string())
    }

    /// A seeded event with a random choice of fields, strings and values.
    fn random_event(rng: &mut impl rand::Rng) -> Event {
        use rand::seq::SliceRandom;
        let words = ["j1", "j1-a2", "r0", "k\"q", "é", "a\\b", "", "line\nbreak", "accepted", "expired", "success"];
        let text = |rng: &mut dyn rand::RngCore| words.choose(rng).map(|word| word.to_string());
        let maybe = |rng: &mut dyn rand::RngCore| rand::Rng::gen_bool(rng, 0.5);
        let processes = [Process::CLIENT, Process::NEMESIS, Process::CONTROL_PLANE, Process::runner("r0")];
        let kinds = [EventType::Invoke, EventType::Ok, EventType::Ledger, EventType::Step, EventType::Response];
        let shift = rng.gen_range(0..64);
        let mut event = Event::new(
            rng.gen_range(0..u64::MAX >> shift),
            processes.choose(rng).cloned().expect("a process"),
            *kinds.choose(rng).expect("a type"),
            *Op::ALL.choose(rng).expect("an op"),
        );
        event.index = rng.gen_range(0..1_000_000);
        let signed = |rng: &mut dyn rand::RngCore| Some(rand::Rng::gen_range(rng, i64::MIN / 2..i64::MAX / 2));
        let values = [
            serde_json::json!({ "seq": 1 }),
            serde_json::json!({ "seq": 2, "played": true, "token_of": "r1", "n": [1, 2.5, -3e-7, null] }),
            serde_json::json!("a \" }"),
            serde_json::json!([[], {}, [{ "a": "]" }]]),
            serde_json::json!(-0.0),
        ];
        let texts = [
            &mut event.project,
            &mut event.job,
            &mut event.attempt,
            &mut event.runner,
            &mut event.key,
            &mut event.reason,
            &mut event.outcome,
        ];
        for field in texts {
            if maybe(rng) {
                *field = text(rng);
            }
        }
        for field in [&mut event.received_ms, &mut event.observed_ms, &mut event.lease_expires_ms] {
            if maybe(rng) {
                *field = signed(rng);
            }
        }
        if maybe(rng) {
            event.fence = Some(rng.gen());
        }
        if maybe(rng) {
            event.decision =
                [Decision::Accepted, Decision::Rejected, Decision::Duplicate, Decision::Conflict].choose(rng).copied();
        }
        if maybe(rng) {
            event.value = values.choose(rng).cloned();
        }
        event
    }

    /// Bytes a mutation writes: JSON's punctuation, digits, letters of its words, space.
    const MUTATIONS: &[u8] = b"\"\\,:{}[]0123456789-.eEnul ax\n\x01";

    #[test]
    fn whatever_the_shortcut_takes_serde_json_reads_the_same() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x9e11);
        let (mut taken, mut mutated_taken) = (0, 0);
        for _ in 0..20_000 {
            let event = random_event(&mut rng);
            let line = serde_json::to_string(&event).expect("an event serialises");
            // Every line serde_json reads back, the shortcut reads as it does or leaves.
            match event_of(line.as_bytes()) {
                Some(quick) => {
                    taken += 1;
                    assert_eq!(Ok(&quick), serde(&line).as_ref(), "{line}");
                }
                None => assert!(line.contains('\\'), "a plain line left to serde_json: {line}"),
            }
            let mut bytes = line.into_bytes();
            for _ in 0..rng.gen_range(1..4) {
                let at = rng.gen_range(0..bytes.len());
                match rng.gen_range(0..3) {
                    0 => bytes[at] = MUTATIONS[rng.gen_range(0..MUTATIONS.len())],
                    1 => {
                        bytes.remove(at);
                    }
                    _ => bytes.insert(at, MUTATIONS[rng.gen_range(0..MUTATIONS.len())]),
                }
                if bytes.is_empty() {
                    break;
                }
            }
            if let Some(quick) = event_of(&bytes) {
                mutated_taken += 1;
                let text = String::from_utf8(bytes).expect("the shortcut takes UTF-8 only");
                assert_eq!(Ok(&quick), serde(&text).as_ref(), "{text}");
            }
        }
        // The shortcut is taken for most lines, and for some mutated ones (a mutation inside
        // a string or a number that stays valid).
        assert!(taken > 5_000, "{taken}");
        assert!(mutated_taken > 500, "{mutated_taken}");
    }

    fn event_of(line: &[u8]) -> Option<Event> {
        event(line)
    }

    #[test]
    fn a_recorded_line_is_read_as_serde_json_reads_it() {
        let lines = [
            r#"{"index":4,"time_ns":4000,"process":"control-plane","type":"ledger","f":"claim","project":"demo","job":"j1","attempt":"j1-a1","runner":"r0","fence":1,"key":"k1","received_ms":1700000000007,"observed_ms":-7,"lease_expires_ms":1700000002007,"decision":"accepted","reason":"expired","outcome":"success","value":{"seq":2,"nested":[1,{"a":"}]\"x"}],"s":"é"}}"#,
            r#"{"time_ns":0,"process":"runner:r0","type":"request","f":"claim","runner":"r0"}"#,
            r#" { "time_ns" : 5 , "process" : "client" , "type" : "ok" , "f" : "submit" , "job" : null , "value" : null } "#,
            r#"{"time_ns":1,"process":"nemesis","type":"info","f":"claim","value":"text"}"#,
            r#"{"time_ns":1,"process":"nemesis","type":"info","f":"claim","value":[1,2]}"#,
            r#"{"time_ns":1,"process":"nemesis","type":"info","f":"claim","value":-1.5e3}"#,
        ];
        for line in lines {
            let quick = event(line.as_bytes()).unwrap_or_else(|| panic!("taken: {line}"));
            assert_eq!(Ok(quick), serde(line), "{line}");
        }
    }

    #[test]
    fn a_line_of_another_shape_is_left_to_serde_json() {
        let lines = [
            // An escape, a duplicate, an unknown key, a fraction, a leading zero, an
            // exponent, a missing required field, a trailing byte, a torn line, a
            // negative where none may be, a number too large, an empty object.
            r#"{"time_ns":0,"process":"client","type":"ok","f":"submit","job":"j\u0031"}"#,
            r#"{"time_ns":0,"time_ns":1,"process":"client","type":"ok","f":"submit"}"#,
            r#"{"time_ns":0,"process":"client","type":"ok","f":"submit","extra":1}"#,
            r#"{"time_ns":0.5,"process":"client","type":"ok","f":"submit"}"#,
            r#"{"time_ns":01,"process":"client","type":"ok","f":"submit"}"#,
            r#"{"time_ns":1e3,"process":"client","type":"ok","f":"submit"}"#,
            r#"{"process":"client","type":"ok","f":"submit"}"#,
            r#"{"time_ns":0,"process":"client","type":"ok","f":"submit"}x"#,
            r#"{"time_ns":0,"process":"client","type":"ok","f":"sub"#,
            r#"{"time_ns":-1,"process":"client","type":"ok","f":"submit"}"#,
            r#"{"time_ns":18446744073709551616,"process":"client","type":"ok","f":"submit"}"#,
            r#"{}"#,
            r#"{"time_ns":0,"process":"client","type":"ok","f":"submit","value":{"seq":}}"#,
            r#"{"time_ns":0,"process":"client","type":"okay","f":"submit"}"#,
        ];
        for line in lines {
            assert_eq!(event(line.as_bytes()), None, "{line}");
        }
    }
}
