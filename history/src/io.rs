//! JSONL reading and writing, with the history's invariants checked both ways.

use std::io::{BufRead, Write};

use crate::{Event, WordError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("history line {line}: {why}")]
    Invalid { line: usize, why: LineError },
    #[error("history i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Why one line cannot be an event of the history, where it stands.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Word(#[from] WordError),
    #[error("index {found} where {expected} was expected")]
    Index { found: u64, expected: u64 },
    #[error("time_ns {time_ns} goes backwards")]
    Backwards { time_ns: u64 },
    #[error("time_ns {time_ns} is before the previous event's {previous_ns}")]
    BeforePrevious { time_ns: u64, previous_ns: u64 },
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
                why: LineError::BeforePrevious { time_ns: event.time_ns, previous_ns: self.last_time_ns },
            });
        }
        if let Err(word) = event.check_vocabulary() {
            return Err(Error::Invalid { line: self.next_index as usize + 1, why: word.into() });
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
pub fn log_line(event: &Event) -> Result<String, WordError> {
    event.check_vocabulary()?;
    let mut value = serde_json::to_value(event).expect("an Event always serialises");
    value.as_object_mut().expect("an Event serialises as an object").remove("index");
    Ok(value.to_string())
}

/// Reads a whole history and checks it: every line an event in the known vocabulary,
/// indices contiguous from 0, times never going backwards. A torn last line (a killed
/// writer) or a word the vocabulary does not hold is an error that names the line.
pub fn read(input: impl std::io::Read) -> Result<Vec<Event>, Error> {
    Reader::new(std::io::BufReader::new(input)).collect()
}

/// One line of a history parsed on its own: an event in the known vocabulary. What only
/// the lines in order can tell (contiguous indices, time never going backwards) is
/// [`Order`]'s.
pub fn parse_line(line: &[u8]) -> Result<Event, LineError> {
    let event: Event = match crate::quick::event(line) {
        Some(event) => event,
        None => serde_json::from_slice(line)?,
    };
    event.check_vocabulary()?;
    Ok(event)
}

/// Whether a line holds nothing but white space (a history skips it).
pub fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

/// The checks a history's events must pass in order: indices contiguous from 0, times
/// never going backwards.
#[derive(Clone, Debug, Default)]
pub struct Order {
    next_index: u64,
    last_time_ns: u64,
}

impl Order {
    pub fn new() -> Order {
        Order::default()
    }

    /// Takes the next event of the history, or says why it cannot come next.
    pub fn next(&mut self, event: &Event) -> Result<(), LineError> {
        if event.index != self.next_index {
            return Err(LineError::Index { found: event.index, expected: self.next_index });
        }
        if event.time_ns < self.last_time_ns {
            return Err(LineError::Backwards { time_ns: event.time_ns });
        }
        self.last_time_ns = event.time_ns;
        self.next_index += 1;
        Ok(())
    }
}

/// A history read one event at a time, with [`read`]'s checks: for histories too long to
/// hold. Each line is parsed from a reused buffer; blank lines are skipped. After the
/// first error it yields nothing more.
pub struct Reader<R: BufRead> {
    input: R,
    line: Vec<u8>,
    number: usize,
    order: Order,
    failed: bool,
}

impl<R: BufRead> Reader<R> {
    pub fn new(input: R) -> Reader<R> {
        Reader { input, line: Vec::with_capacity(512), number: 0, order: Order::new(), failed: false }
    }

    /// The number of the last line read, from 1.
    pub fn line(&self) -> usize {
        self.number
    }

    fn next_event(&mut self) -> Option<Result<Event, Error>> {
        loop {
            self.line.clear();
            match self.input.read_until(b'\n', &mut self.line) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(error) => return Some(Err(Error::Io(error))),
            }
            self.number += 1;
            if !is_blank(&self.line) {
                break;
            }
        }
        let invalid = |why: LineError| Error::Invalid { line: self.number, why };
        let event = match parse_line(&self.line) {
            Ok(event) => event,
            Err(why) => return Some(Err(invalid(why))),
        };
        if let Err(why) = self.order.next(&event) {
            return Some(Err(invalid(why)));
        }
        Some(Ok(event))
    }
}

impl<R: BufRead> Iterator for Reader<R> {
    type Item = Result<Event, Error>;

    fn next(&mut self) -> Option<Result<Event, Error>> {
        if self.failed {
            return None;
        }
        let next = self.next_event();
        self.failed = matches!(next, Some(Err(_)));
        next
    }
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
        assert!(
            matches!(log_line(&unknown), Err(WordError::Unknown { field, word, .. }) if field == "reason" && word == "late")
        );
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
