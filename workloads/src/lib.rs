//! Pure, seeded generators for a run: the client's jobs, the fault schedule, and the
//! operator's decision for an uncertain job. Nothing here touches a process, a socket or
//! a clock: the same seed and the same options give the same plan, byte for byte.
//!
//! ```
//! use workloads::faults::{schedule, FaultKind, ScheduleOptions};
//! let options = ScheduleOptions { kinds: FaultKind::ALL.to_vec(), time_limit_ms: 30_000, runners: 3, lease_ms: 1_000, replicas: 1, without: vec![] };
//! assert_eq!(schedule(7, &options), schedule(7, &options));
//! ```

pub mod faults;
pub mod jobs;
pub mod operator;
pub mod scenario;

/// The random generator of a plan, derived from the run's seed and a purpose, so that
/// adding faults does not change the jobs (and the other way round).
pub fn rng(seed: u64, purpose: &str) -> rand_chacha::ChaCha8Rng {
    use rand::SeedableRng;
    let mut mixed = seed ^ 0x9e37_79b9_7f4a_7c15;
    for byte in purpose.bytes() {
        mixed = (mixed ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    rand_chacha::ChaCha8Rng::seed_from_u64(mixed)
}
