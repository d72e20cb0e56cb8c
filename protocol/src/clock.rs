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

/// Waits until this process's wall clock reads at least `until_ms`: a timer for all but the
/// last millisecond, then the clock itself, not a timer's rounding, so that what follows
/// starts within the first part of that millisecond (a request aimed at a lease's end).
pub async fn sleep_until_wall_ms(until_ms: i64) {
    let left_ms = until_ms.saturating_sub(wall_ms()).saturating_sub(1);
    if left_ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(left_ms as u64)).await;
    }
    while wall_ms() < until_ms {
        tokio::task::yield_now().await;
    }
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

    #[tokio::test]
    async fn sleeping_until_a_wall_millisecond_reaches_it_and_not_much_later() {
        let until_ms = super::wall_ms() + 30;
        super::sleep_until_wall_ms(until_ms).await;
        let now_ms = super::wall_ms();
        assert!(now_ms >= until_ms, "woke at {now_ms}, before {until_ms}");
        super::sleep_until_wall_ms(now_ms - 5).await; // a past instant: at once
    }
}
