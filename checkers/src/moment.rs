//! How an anomaly's sentence says an instant: in seconds on the history's clock (`time_ns`;
//! in a run, since its start), as the rest of a report counts time, with the reading of the
//! clock the record itself carries in parentheses (the server's `received_ms`, the target's
//! step time), the wall-clock value a reader matches against the system's own logs. Every
//! checker message that names an instant says it through [`Moment`].

use crate::model::Observed;

/// One instant on two clocks: the history's and the record's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moment {
    /// On the history's clock, in nanoseconds (below zero for an instant before its origin).
    pub at_ns: i128,
    /// Whose clock `ms` is read on: `server`, `target`.
    pub clock: &'static str,
    /// The record's reading, in milliseconds of that clock.
    pub ms: i64,
}

impl Moment {
    /// The instant of an event whose record carries a reading of `clock`, `ms`.
    pub fn of(ev: &Observed, clock: &'static str, ms: i64) -> Moment {
        Moment { at_ns: i128::from(ev.raw.time_ns), clock, ms }
    }

    /// Another reading of the same clock (a lease's end, which no event of its own marks),
    /// placed on the history's clock at this instant's offset between the two.
    pub fn then(self, ms: i64) -> Moment {
        let delta_ns = (i128::from(ms) - i128::from(self.ms)) * 1_000_000;
        Moment { at_ns: self.at_ns + delta_ns, ms, ..self }
    }
}

impl std::fmt::Display for Moment {
    /// `12.345 s (server clock 1796563116613 ms)`: milliseconds of the history's clock,
    /// rounded toward its origin.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.at_ns / 1_000_000;
        let sign = if ms < 0 { "-" } else { "" };
        let ms = ms.unsigned_abs();
        write!(f, "{sign}{}.{:03} s ({} clock {} ms)", ms / 1_000, ms % 1_000, self.clock, self.ms)
    }
}

#[cfg(test)]
mod tests {
    use super::Moment;

    #[test]
    fn an_instant_is_said_in_the_runs_seconds_with_its_own_clock_beside() {
        let at = Moment { at_ns: 12_345_678_901, clock: "server", ms: 1_796_563_116_613 };
        assert_eq!(at.to_string(), "12.345 s (server clock 1796563116613 ms)");
        assert_eq!(at.then(1_796_563_117_467).to_string(), "13.199 s (server clock 1796563117467 ms)");
        let early = Moment { at_ns: 5_000_000, clock: "target", ms: 1_000 };
        assert_eq!(early.then(900).to_string(), "-0.095 s (target clock 900 ms)");
    }
}
