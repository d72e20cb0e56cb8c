//! The recorder: the harness's own operations go to `history.jsonl` as they happen (each
//! flushed, so a killed harness leaves a readable prefix); at the end every source — the
//! runners' logs, the control plane's ledger, the target's step log — is merged onto the
//! run's clock and the file is replaced by the whole history.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use history::{Event, EventType, Op, Process, Writer};
use protocol::{LedgerEntry, StepRecord};
use runfolder::folder::write_whole;
use system::collect::{merge, read_runner_log, Sources};

pub struct Recorder {
    start_ns: u64,
    path: PathBuf,
    writer: Mutex<Option<Writer<File>>>,
    events: Mutex<Vec<Event>>,
}

impl Recorder {
    pub fn create(path: &Path) -> std::io::Result<Recorder> {
        let file = File::create(path)?;
        Ok(Recorder {
            start_ns: protocol::monotonic_ns(),
            path: path.to_path_buf(),
            writer: Mutex::new(Some(Writer::new(file))),
            events: Mutex::new(Vec::new()),
        })
    }

    /// Nanoseconds since the run started.
    pub fn now_ns(&self) -> u64 {
        protocol::monotonic_ns().saturating_sub(self.start_ns)
    }

    /// Milliseconds since the run started.
    pub fn now_ms(&self) -> u64 {
        self.now_ns() / 1_000_000
    }

    /// Records one harness event now; `fill` sets its fields. The time is taken under the
    /// lock, so the live file is in time order.
    pub fn record(&self, process: Process, kind: EventType, f: Op, fill: impl FnOnce(&mut Event)) {
        let mut writer = self.writer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut event = Event::new(self.now_ns(), process, kind, f);
        fill(&mut event);
        if let Some(live) = writer.as_mut() {
            if let Err(error) = live.append(event.clone()) {
                eprintln!("fencelab: cannot write the history: {error}");
            }
        }
        self.events.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(event);
    }

    pub fn rebase(&self, mono_ns: u64) -> u64 {
        mono_ns.saturating_sub(self.start_ns)
    }

    /// Merges every source and replaces the live file with the whole history.
    pub fn finish(
        &self,
        runner_logs: &[PathBuf],
        ledger: &[LedgerEntry],
        steps: &[StepRecord],
        finals: Vec<Event>,
    ) -> std::io::Result<usize> {
        self.writer.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        let own = std::mem::take(&mut *self.events.lock().unwrap_or_else(|p| p.into_inner()));
        let sources = Sources { own, runner_logs, ledger, steps, closing: finals };
        let all = merge(self.start_ns, self.now_ns(), sources);
        write_whole(&self.path, all)
    }
}

impl Recorder {
    /// The harness's own events so far.
    pub fn snapshot(&self) -> Vec<Event> {
        self.events.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// The history so far, as the end of the run would merge it from these records (read
    /// in this order by the caller), without the closing events.
    pub fn partial(
        &self,
        own: Vec<Event>,
        runners: Vec<Event>,
        ledger: &[LedgerEntry],
        steps: &[StepRecord],
    ) -> Vec<Event> {
        let mut own = own;
        own.extend(runners);
        let sources = Sources { own, runner_logs: &[], ledger, steps, closing: vec![] };
        merge(self.start_ns, self.now_ns(), sources)
    }
}

/// The runners' logs as they are now, on the history's clock (a blocking read, off the
/// async workers).
pub async fn read_runner_logs(recorder: &Recorder, logs: &[PathBuf]) -> Vec<Event> {
    let (start_ns, now_ns, logs) = (recorder.start_ns, recorder.now_ns(), logs.to_vec());
    let read = move || logs.iter().flat_map(|path| read_runner_log(path, start_ns, now_ns)).collect();
    tokio::task::spawn_blocking(read).await.unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use history::Decision;
    use protocol::Outcome;
    use serde_json::json;

    /// A foreign runner's log, written by hand: no `index`, times on the host's monotonic
    /// clock from `t0`. One job claimed, one step redeemed and applied, success reported.
    fn foreign_log(t0: u64) -> String {
        let claim = r#""job":"j1","attempt":"j1-a1","runner":"r1","fence":1"#;
        let lines = [
            format!(
                r#"{{"time_ns":{},"process":"runner:r1","type":"request","f":"claim","runner":"r1","observed_ms":1000}}"#,
                t0 + 10
            ),
            format!(
                r#"{{"time_ns":{},"process":"runner:r1","type":"response","f":"claim",{claim},"key":"prod","observed_ms":1000,"lease_expires_ms":3000,"decision":"accepted"}}"#,
                t0 + 30
            ),
            format!(
                r#"{{"time_ns":{},"process":"runner:r1","type":"request","f":"capability",{claim},"observed_ms":1100}}"#,
                t0 + 40
            ),
            format!(
                r#"{{"time_ns":{},"process":"runner:r1","type":"response","f":"capability",{claim},"observed_ms":1100,"lease_expires_ms":3000,"decision":"accepted","value":{{"ledger_seq":3}}}}"#,
                t0 + 60
            ),
            format!(
                r#"{{"time_ns":{},"process":"runner:r1","type":"request","f":"step",{claim},"key":"prod","value":{{"step":0,"steps":1}}}}"#,
                t0 + 70
            ),
            format!(
                r#"{{"time_ns":{},"process":"runner:r1","type":"response","f":"step",{claim},"key":"prod","decision":"accepted","value":{{"step":0,"steps":1}}}}"#,
                t0 + 90
            ),
            format!(
                r#"{{"time_ns":{},"process":"runner:r1","type":"request","f":"result",{claim},"observed_ms":1200,"outcome":"succeeded"}}"#,
                t0 + 100
            ),
            format!(
                r#"{{"time_ns":{},"process":"runner:r1","type":"response","f":"result",{claim},"observed_ms":1200,"outcome":"succeeded","decision":"accepted","value":{{"ledger_seq":4}}}}"#,
                t0 + 120
            ),
        ];
        lines.iter().map(|line| format!("{line}\n")).collect()
    }

    fn entry(seq: u64, kind: Op, mono_ns: u64, received_ms: i64) -> LedgerEntry {
        LedgerEntry {
            seq,
            kind,
            project: "demo".into(),
            job: "j1".into(),
            attempt: None,
            runner: None,
            fence: None,
            deployment_key: "prod".into(),
            decision: None,
            reason: None,
            recorded_as: None,
            outcome: None,
            received_ms,
            observed_ms: None,
            mono_ns,
            lease_expires_ms: None,
        }
    }

    /// The control plane's ledger and the target's step log that go with [`foreign_log`].
    fn ledger_and_steps(t0: u64) -> (Vec<LedgerEntry>, Vec<StepRecord>) {
        let report = |seq, kind, at: u64, received_ms| LedgerEntry {
            attempt: Some("j1-a1".into()),
            runner: Some("r1".into()),
            fence: Some(1),
            decision: Some(Decision::Accepted),
            observed_ms: Some(received_ms),
            ..entry(seq, kind, t0 + at, received_ms)
        };
        let claim = LedgerEntry { lease_expires_ms: Some(3_000), ..report(2, Op::Claim, 20, 1_000) };
        let capability = LedgerEntry { lease_expires_ms: Some(3_000), ..report(3, Op::Capability, 50, 1_100) };
        let result = LedgerEntry { outcome: Some(Outcome::Succeeded.into()), ..report(4, Op::Result, 110, 1_200) };
        let ledger = vec![entry(1, Op::Submit, t0 + 5, 900), claim, capability, result];
        let step = StepRecord {
            seq: 0,
            deployment_key: "prod".into(),
            job: "j1".into(),
            attempt: "j1-a1".into(),
            runner: "r1".into(),
            fence: 1,
            step: 0,
            steps: 1,
            applied: true,
            reason: None,
            revision: 1,
            highest_fence_before: 0,
            received_ms: 1_150,
            mono_ns: t0 + 80,
        };
        (ledger, vec![step])
    }

    #[test]
    fn a_foreign_runner_log_without_index_merges_into_a_history_that_checks() {
        let dir = tempfile::tempdir().unwrap();
        let path = runfolder::folder::RunFolder::at(dir.path()).history_path();
        let recorder = Recorder::create(&path).unwrap();
        recorder.record(Process::HARNESS, EventType::Ok, Op::Config, |event| {
            event.value = Some(json!({"target_mode": "fenced", "bugs": [], "lease_ms": 2_000}));
        });
        recorder.record(Process::CLIENT, EventType::Invoke, Op::Submit, |event| {
            (event.job, event.key) = (Some("j1".into()), Some("prod".into()));
        });
        let t0 = protocol::monotonic_ns();
        recorder.record(Process::CLIENT, EventType::Ok, Op::Submit, |event| {
            (event.job, event.key) = (Some("j1".into()), Some("prod".into()));
        });
        let log = dir.path().join("runner-r1.jsonl");
        std::fs::write(&log, foreign_log(t0)).unwrap();
        let (ledger, steps) = ledger_and_steps(t0);
        let mut last = Event::new(0, Process::HARNESS, EventType::Ok, Op::Final).with_job("j1");
        (last.key, last.attempt, last.outcome) = (Some("prod".into()), Some("j1-a1".into()), Some("succeeded".into()));
        last.value = Some(
            json!({"attempts": [{"attempt": "j1-a1", "runner": "r1", "fence": 1, "state": "succeeded", "closed_by": "result"}]}),
        );

        // As the driver does: the run declares every source it held (a nemesis that did
        // nothing, an operator with nothing to reconcile).
        let every = history::Source::ALL.iter().copied().collect();
        recorder.finish(&[log], &ledger, &steps, vec![last, history::sources_event(&every)]).unwrap();

        let events = history::read(std::fs::File::open(&path).unwrap()).unwrap();
        let from_log: Vec<&Event> = events.iter().filter(|event| event.process == Process::runner("r1")).collect();
        assert_eq!(from_log.len(), 8, "every line of the log is in the history: {events:#?}");
        assert!(events.iter().all(|event| event.f != Op::Unreadable), "{events:#?}");
        for result in checkers::check_all(&events) {
            assert_eq!(result.verdict, checkers::Verdict::Valid, "{}: {events:#?}", result.checker);
        }
    }
}
