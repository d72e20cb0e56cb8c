//! The run's `config` event (`harness` `ok` `config`, first in a run's history) in its one
//! typed shape. Every writer builds the event through [`Config::event`] — a run's whole
//! configuration, conform's lease, the lease and missing parts of records gathered by hand
//! — and every reader (the checkers, the reports) takes it through [`Config::of`]. What no
//! checker reads rides along in `rest`, as written, for the reports to show.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Event, EventType, Op, Process};

/// What a history says of the run's configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// The control plane's lease policy, in ms; none when not known (records gathered by
    /// hand without `--lease-ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// How long before its lease ends a runner stops acting, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewal_margin_ms: Option<u64>,
    /// The target's mode (`fenced`, `idempotent`, `unfenced`); none: fenced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_mode: Option<crate::TargetMode>,
    /// The system attacked, and what of the run it could not take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<SystemConfig>,
    /// The rest of a run's configuration (seed, runners, faults, timings …), as written.
    #[serde(flatten)]
    pub rest: BTreeMap<String, Value>,
}

/// The system part of the `config` event (`docs/system.md`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SystemConfig {
    /// The optional parts of the contract the system lacks (`lease`, `runner-log`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub absent: Option<Vec<String>>,
    /// The faults the run did not execute, each with the part it needs and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub faults_not_run: Option<Vec<Value>>,
    /// The rest (the system's name, file, variants), as written.
    #[serde(flatten)]
    pub rest: BTreeMap<String, Value>,
}

impl Config {
    /// The `config` event that says this configuration.
    pub fn event(&self) -> Event {
        let mut event = Event::new(0, Process::HARNESS, EventType::Ok, Op::Config);
        event.value = Some(serde_json::to_value(self).expect("a config serialises"));
        event
    }

    /// The configuration a `config` event says; none for any other event, or for a value
    /// that is not the config's shape (a field of the wrong type).
    pub fn of(event: &Event) -> Option<Config> {
        if event.process != Process::HARNESS || event.f != Op::Config {
            return None;
        }
        serde_json::from_value(event.value.clone()?).ok()
    }

    /// The parts of the contract the system lacks.
    pub fn absent(&self) -> &[String] {
        self.system.as_ref().and_then(|system| system.absent.as_deref()).unwrap_or_default()
    }

    /// Whether the target ran without fencing.
    pub fn target_unfenced(&self) -> bool {
        self.target_mode == Some(crate::TargetMode::Unfenced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_reads_back_what_it_wrote_and_keeps_the_rest_as_written() {
        let value = serde_json::json!({
            "lease_ms": 1_000, "renewal_margin_ms": 200, "target_mode": "unfenced", "seed": 7,
            "system": {"absent": ["lease"], "faults_not_run": [], "name": "lab"}, "schedule": null,
        });
        let mut event = Event::new(0, Process::HARNESS, EventType::Ok, Op::Config);
        event.value = Some(value.clone());
        let config = Config::of(&event).expect("a config event");
        assert_eq!(
            (config.lease_ms, config.absent(), config.target_unfenced()),
            (Some(1_000), &["lease".into()][..], true)
        );
        assert_eq!(config.event().value, Some(value), "the same value, key for key");
        let bare = Config { lease_ms: Some(500), ..Config::default() };
        assert_eq!(bare.event().value, Some(serde_json::json!({"lease_ms": 500})));
        assert_eq!(Config::of(&Event::new(0, Process::HARNESS, EventType::Ok, Op::Final)), None);
    }
}
