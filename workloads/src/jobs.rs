//! The client's workload: deployment jobs over K deployment keys at a rate.

use rand::Rng;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedJob {
    /// When to submit it, ms after the run started.
    pub at_ms: u64,
    pub id: String,
    pub deployment_key: String,
    pub steps: u32,
    pub step_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobOptions {
    pub time_limit_ms: u64,
    /// Jobs per second, on average.
    pub rate_per_s: f64,
    pub keys: u32,
    pub steps_min: u32,
    pub steps_max: u32,
    pub step_ms_min: u64,
    pub step_ms_max: u64,
    /// Never plan more than this many jobs (default 100 000).
    pub jobs_max: usize,
}

/// The jobs of a run: exponential gaps at `rate_per_s`, keys and sizes uniform.
pub fn plan(seed: u64, options: &JobOptions) -> Vec<PlannedJob> {
    let mut rng = crate::rng(seed, "jobs");
    let mean_gap_ms = 1_000.0 / options.rate_per_s.max(0.001);
    let mut jobs = Vec::new();
    let mut at_ms = 0.0f64;
    while jobs.len() < options.jobs_max {
        let uniform: f64 = rng.gen_range(f64::EPSILON..1.0);
        at_ms += -uniform.ln() * mean_gap_ms;
        if at_ms >= options.time_limit_ms as f64 {
            break;
        }
        jobs.push(PlannedJob {
            at_ms: at_ms as u64,
            id: format!("j{}", jobs.len() + 1),
            deployment_key: format!("key-{}", rng.gen_range(0..options.keys.max(1))),
            steps: rng.gen_range(options.steps_min..=options.steps_max.max(options.steps_min)),
            step_ms: rng.gen_range(options.step_ms_min..=options.step_ms_max.max(options.step_ms_min)),
        });
    }
    jobs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> JobOptions {
        JobOptions {
            time_limit_ms: 10_000,
            rate_per_s: 5.0,
            keys: 3,
            steps_min: 2,
            steps_max: 4,
            step_ms_min: 10,
            step_ms_max: 50,
            jobs_max: 1_000,
        }
    }

    #[test]
    fn same_seed_same_jobs_and_another_seed_other_jobs() {
        assert_eq!(plan(1, &options()), plan(1, &options()));
        assert_ne!(plan(1, &options()), plan(2, &options()));
    }

    #[test]
    fn jobs_stay_inside_the_bounds() {
        let jobs = plan(3, &options());
        assert!((20..=90).contains(&jobs.len()), "about 50 jobs expected, got {}", jobs.len());
        assert!(jobs.windows(2).all(|pair| pair[0].at_ms <= pair[1].at_ms));
        for job in &jobs {
            assert!(job.at_ms < 10_000 && (2..=4).contains(&job.steps) && (10..=50).contains(&job.step_ms));
            assert!(["key-0", "key-1", "key-2"].contains(&job.deployment_key.as_str()));
        }
        let capped = JobOptions { jobs_max: 5, ..options() };
        assert_eq!(plan(3, &capped).len(), 5);
    }
}
