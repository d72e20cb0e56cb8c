//! JSONL reading and writing, with the history's invariants checked both ways.

use std::io::{BufRead, Write};

use crate::Event;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("history line {line}: {message}")]
    Invalid { line: usize, message: String },
    #[error("history i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Appends events as JSON lines, flushing each, and assigns contiguous indices.
///
/// Times must not go backwards: sources are merged in time order before they are written.
pub struct Writer<W: Write> {
    out: W,
    next_index: u64,
    last_time_ns: u64,
}

impl<W: Write> Writer<W> {
    pub fn new(out: W) -> Writer<W> {
        Writer { out, next_index: 0, last_time_ns: 0 }
    }

    /// Writes one event and returns the index it was given.
    pub fn append(&mut self, mut event: Event) -> Result<u64, Error> {
        if event.time_ns < self.last_time_ns {
            return Err(Error::Invalid {
                line: self.next_index as usize + 1,
                message: format!("time_ns {} is before the previous event's {}", event.time_ns, self.last_time_ns),
            });
        }
        if let Err(message) = event.check_vocabulary() {
            return Err(Error::Invalid { line: self.next_index as usize + 1, message });
        }
        event.index = self.next_index;
        let line = serde_json::to_string(&event).expect("an Event always serialises");
        self.out.write_all(line.as_bytes())?;
        self.out.write_all(b"\n")?;
        self.out.flush()?;
        self.last_time_ns = event.time_ns;
        self.next_index += 1;
        Ok(event.index)
    }

    pub fn len(&self) -> u64 {
        self.next_index
    }

    pub fn is_empty(&self) -> bool {
        self.next_index == 0
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

/// The line a runner's log holds for `event`: the event as JSON without `index`. A log is
/// not numbered (the merge numbers the history); its vocabulary is checked as a history's.
pub fn log_line(event: &Event) -> Result<String, String> {
    event.check_vocabulary()?;
    let mut value = serde_json::to_value(event).expect("an Event always serialises");
    value.as_object_mut().expect("an Event serialises as an object").remove("index");
    Ok(value.to_string())
}

/// Reads a whole history and checks it: every line an event in the known vocabulary,
/// indices contiguous from 0, times never going backwards. A torn last line (a killed
/// writer) or a word the vocabulary does not hold is an error that names the line.
pub fn read(input: impl std::io::Read) -> Result<Vec<Event>, Error> {
    let reader = std::io::BufReader::new(input);
    let mut events = Vec::new();
    let mut last_time_ns = 0;
    for (number, line) in reader.lines().enumerate() {
        let line = line?;
        let invalid = |message: String| Error::Invalid { line: number + 1, message };
        if line.trim().is_empty() {
            continue;
        }
        let event: Event = serde_json::from_str(&line).map_err(|e| invalid(e.to_string()))?;
        event.check_vocabulary().map_err(invalid)?;
        if event.index != events.len() as u64 {
            return Err(invalid(format!("index {} where {} was expected", event.index, events.len())));
        }
        if event.time_ns < last_time_ns {
            return Err(invalid(format!("time_ns {} goes backwards", event.time_ns)));
        }
        last_time_ns = event.time_ns;
        events.push(event);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Decision, EventType, Op, Process, Reason};

    fn sample(time_ns: u64) -> Event {
        Event::new(time_ns, Process::runner("r1"), EventType::Response, Op::Result)
            .with_claim("j1", "a1", "r1", 7)
            .with_decision(Decision::Rejected, Some(Reason::Superseded))
    }

    #[test]
    fn round_trip_keeps_every_field() {
        let mut writer = Writer::new(Vec::new());
        let mut event = sample(5);
        event.received_ms = Some(1_000);
        event.observed_ms = Some(61_000);
        writer.append(event.clone()).unwrap();
        let back = read(&writer.into_inner()[..]).unwrap();
        assert_eq!(back, vec![event]);
    }

    #[test]
    fn writer_refuses_time_going_backwards() {
        let mut writer = Writer::new(Vec::new());
        writer.append(sample(10)).unwrap();
        let error = writer.append(sample(9)).unwrap_err();
        assert!(error.to_string().contains("before the previous"), "{error}");
        assert_eq!(writer.len(), 1);
    }

    #[test]
    fn reader_names_the_line_of_a_torn_tail() {
        let mut writer = Writer::new(Vec::new());
        writer.append(sample(1)).unwrap();
        let mut bytes = writer.into_inner();
        bytes.extend_from_slice(b"{\"index\":1,\"time_");
        let error = read(&bytes[..]).unwrap_err();
        assert!(error.to_string().starts_with("history line 2:"), "{error}");
    }

    #[test]
    fn reader_refuses_gaps_and_unknown_fields() {
        let gap = "{\"index\":1,\"time_ns\":0,\"process\":\"client\",\"type\":\"ok\",\"f\":\"submit\"}\n";
        assert!(read(gap.as_bytes()).unwrap_err().to_string().contains("index 1"));
        let unknown =
            "{\"index\":0,\"time_ns\":0,\"process\":\"client\",\"type\":\"ok\",\"f\":\"submit\",\"extra\":1}\n";
        assert!(read(unknown.as_bytes()).unwrap_err().to_string().contains("extra"));
    }

    #[test]
    fn a_log_line_carries_no_index_and_reads_back_as_the_event() {
        let event = sample(7);
        let line = log_line(&event).unwrap();
        assert!(!line.contains("\"index\""), "{line}");
        assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), event);
        let mut unknown = sample(7);
        unknown.reason = Some("late".into());
        assert!(log_line(&unknown).unwrap_err().contains("unknown reason `late`"));
    }

    #[test]
    fn reader_and_writer_refuse_words_outside_the_vocabulary() {
        let line = |process: &str, f: &str, extra: &str| {
            format!(
                "{{\"index\":0,\"time_ns\":0,\"process\":\"{process}\",\"type\":\"ledger\",\"f\":\"{f}\"{extra}}}\n"
            )
        };
        let cases = [
            (line("control-plane", "heartbeat-v2", ""), "unknown op `heartbeat-v2`"),
            (line("control-plane2", "heartbeat", ""), "unknown process `control-plane2`"),
            (line("control-plane", "result", ",\"decision\":\"accepted-ish\""), "accepted-ish"),
            (
                line("control-plane", "result", ",\"decision\":\"rejected\",\"reason\":\"late\""),
                "unknown reason `late`",
            ),
            (line("control-plane", "result", ",\"outcome\":\"won\""), "unknown outcome `won`"),
            (line("control-plane", "expire", ",\"value\":{\"recorded_as\":\"lost\"}"), "unknown recorded_as `lost`"),
        ];
        for (text, expected) in cases {
            let error = read(text.as_bytes()).unwrap_err().to_string();
            assert!(error.starts_with("history line 1:") && error.contains(expected), "{text}: {error}");
        }
        let mut event = sample(1);
        event.reason = Some("late".into());
        let mut writer = Writer::new(Vec::new());
        assert!(writer.append(event).unwrap_err().to_string().contains("unknown reason `late`"));
        let mut free_text = sample(1);
        free_text.decision = None;
        free_text.reason = Some("connection refused".into());
        writer.append(free_text).expect("an undecided event's reason is free text");
    }
}
