//! The one clock of a run: `CLOCK_MONOTONIC`, shared by every process on the host.
//!
//! Processes write absolute monotonic nanoseconds; the harness subtracts the run's start
//! so that every event of a history sits on one axis. libfaketime leaves this clock alone
//! when `FAKETIME_DONT_FAKE_MONOTONIC=1` is set, which the harness does for skewed runners.

/// Nanoseconds on the host's monotonic clock.
pub fn monotonic_ns() -> u64 {
    let mut spec = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `spec` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut spec) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    spec.tv_sec as u64 * 1_000_000_000 + spec.tv_nsec as u64
}

/// Unix milliseconds on this process's wall clock (libfaketime's, where it is preloaded):
/// what leases are measured on, and what a runner reports as `observed_ms`.
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("the clock is after 1970").as_millis()
        as i64
}

#[cfg(test)]
mod tests {
    #[test]
    fn monotonic_never_goes_back() {
        let first = super::monotonic_ns();
        let second = super::monotonic_ns();
        assert!(second >= first);
        assert!(first > 0);
    }
}
