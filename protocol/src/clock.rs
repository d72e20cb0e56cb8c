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

/// Unix microseconds on this process's wall clock (the clock of [`wall_ms`], finer).
pub fn wall_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("the clock is after 1970").as_micros()
        as i64
}

/// Waits until this process's wall clock reads at least `until_ms`.
pub async fn sleep_until_wall_ms(until_ms: i64) {
    sleep_until_wall_us(until_ms.saturating_mul(1_000)).await;
}

/// Waits until this process's wall clock reads at least `until_us`: a timer for all but the
/// last two milliseconds, then the clock itself, not a timer's rounding, so that what
/// follows starts within a fraction of a millisecond of it (a request aimed at a lease's end).
pub async fn sleep_until_wall_us(until_us: i64) {
    let left_us = until_us.saturating_sub(wall_us()).saturating_sub(2_000);
    if left_us > 0 {
        tokio::time::sleep(std::time::Duration::from_micros(left_us as u64)).await;
    }
    while wall_us() < until_us {
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
    async fn sleeping_until_a_wall_instant_reaches_it() {
        let until_ms = super::wall_ms() + 30;
        super::sleep_until_wall_ms(until_ms).await;
        let now_ms = super::wall_ms();
        assert!(now_ms >= until_ms, "woke at {now_ms}, before {until_ms}");
        let until_us = super::wall_us() + 2_500;
        super::sleep_until_wall_us(until_us).await;
        assert!(super::wall_us() >= until_us);
        super::sleep_until_wall_ms(now_ms - 5).await; // a past instant: at once
    }
}
