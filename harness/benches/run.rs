//! Two figures of `fencelab run`, printed as tables:
//! 1. time from start to a healthy cluster (control plane, target, 3 runners, 6 proxies),
//!    over repeated starts in this process;
//! 2. the harness's own CPU share during a 20-second run with every fault, beside the CPU
//!    of the lab processes it drives.
//!
//! Each for the lab as processes and, when a Docker daemon answers, as containers
//! (`systems/lab-containers.toml` on `fencelab-lab:local`, built first from this binary),
//! in the same run on the same machine; for containers, the Docker daemon's own CPU
//! (dockerd, containerd, its shims) is shown beside.
//!
//! Run: `cargo bench -p harness --bench run`. With `FENCELAB_BENCH_SMOKE=1` (CI: `cargo test
//! --benches`) it starts each cluster twice and runs 3 s: it checks the bench runs, not speed.

use std::path::Path;
use std::time::{Duration, Instant};

use engine::run::cluster::Cluster;
use harness::args::RunArgs;

const STARTS: usize = 10;
const RUN_SECONDS: u64 = 20;

/// Starts of each cluster and seconds of each run: [`STARTS`] and [`RUN_SECONDS`], or 2 and
/// 3 in smoke mode.
fn sizes() -> (usize, u64) {
    match std::env::var_os("FENCELAB_BENCH_SMOKE") {
        Some(_) => (2, 3),
        None => (STARTS, RUN_SECONDS),
    }
}

fn args(store: &Path, system: Option<&Path>) -> RunArgs {
    use clap::Parser;
    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        run: RunArgs,
    }
    let store = store.to_string_lossy().into_owned();
    let mut words = vec!["bench".to_string(), "--store".into(), store, "--seed".into(), "1".into()];
    if let Some(system) = system {
        words.extend(["--system".to_string(), system.display().to_string()]);
    }
    Wrapper::parse_from(words).run
}

async fn startup(store: &Path, system: Option<&Path>) {
    let config = args(store, system).config(1).expect("valid flags");
    let mut times_ms = Vec::new();
    let kind = if system.is_some() { "containers" } else { "processes" };
    let starts = sizes().0;
    for index in 0..starts {
        let started = Instant::now();
        let mut cluster = Cluster::start(
            &config,
            &store.join(format!("{kind}-start-{index}")),
            Path::new(env!("CARGO_BIN_EXE_fencelab")),
        )
        .await
        .expect("cluster starts");
        times_ms.push(started.elapsed().as_secs_f64() * 1_000.0);
        cluster.stop().await;
    }
    times_ms.sort_by(f64::total_cmp);
    println!("{:>24} {:>8} {:>8} {:>8}", "start to healthy (ms)", "min", "p50", "max");
    println!(
        "{:>24} {:>8.1} {:>8.1} {:>8.1}",
        if system.is_some() { "containers: 3 runners" } else { "processes: 3 runners" },
        times_ms[0],
        times_ms[starts / 2],
        times_ms[starts - 1]
    );
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    Some(ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

/// CPU seconds of every process whose command line names `store` (the lab's processes).
fn lab_cpu_seconds(store: &Path, seen: &mut std::collections::HashMap<u32, f64>) {
    let needle = store.to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains(&needle) && cmdline.contains("\0lab\0") {
            if let Some(seconds) = cpu_seconds(pid) {
                seen.insert(pid, seconds);
            }
        }
    }
}

/// CPU seconds of the Docker daemon's processes (dockerd, containerd, its shims) now.
fn docker_cpu_seconds() -> f64 {
    let mut total = 0.0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if ["dockerd", "containerd"].iter().any(|name| comm.trim().starts_with(name)) {
            total += cpu_seconds(pid).unwrap_or(0.0);
        }
    }
    total
}

fn cpu_share(store: &Path, system: Option<&Path>) {
    let docker_before = docker_cpu_seconds();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_fencelab"));
    let run_s = sizes().1;
    command.args(["run", "--nemesis", "all", "--seed", "1", "--time-limit", &run_s.to_string(), "--store"]);
    command.arg(store);
    if let Some(system) = system {
        command.arg("--system").arg(system);
    }
    let mut child = command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("fencelab starts");
    let started = Instant::now();
    let (mut harness_s, mut lab) = (0.0, std::collections::HashMap::new());
    while child.try_wait().expect("wait").is_none() && started.elapsed() < Duration::from_secs(run_s + 120) {
        harness_s = cpu_seconds(child.id()).unwrap_or(harness_s);
        lab_cpu_seconds(store, &mut lab);
        std::thread::sleep(Duration::from_millis(100));
    }
    let wall_s = started.elapsed().as_secs_f64();
    let lab_s: f64 = lab.values().sum();
    let docker_s = docker_cpu_seconds() - docker_before;
    let label = format!("{}, {run_s} s run", if system.is_some() { "containers" } else { "processes" });
    println!("{:>24} {:>10} {:>12} {:>14} {:>16}", label, "wall (s)", "harness (s)", "lab procs (s)", "harness share");
    println!(
        "{:>24} {:>10.1} {:>12.2} {:>14.2} {:>15.1}%",
        "",
        wall_s,
        harness_s,
        lab_s,
        100.0 * harness_s / (harness_s + lab_s).max(f64::EPSILON)
    );
    println!("{:>24} harness CPU per wall second: {:.1}% of one core", "", 100.0 * harness_s / wall_s);
    if system.is_some() {
        println!("{:>24} Docker daemon (dockerd, containerd, shims): {docker_s:.2} s", "");
    }
}

#[tokio::main]
async fn main() {
    let store = tempfile::tempdir().expect("temp dir");
    startup(store.path(), None).await;
    let containers = match system::container::unavailable() {
        Some(why) => {
            println!("containers: not measured ({why})");
            None
        }
        None => {
            let built = std::process::Command::new(env!("CARGO_BIN_EXE_fencelab"))
                .args(["image", "build"])
                .status()
                .expect("fencelab image build runs");
            assert!(built.success(), "fencelab image build");
            Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../systems/lab-containers.toml"))
        }
    };
    if let Some(system) = &containers {
        startup(store.path(), Some(system)).await;
    }
    cpu_share(&store.path().join("cpu"), None);
    if let Some(system) = &containers {
        cpu_share(&store.path().join("cpu-containers"), Some(system));
    }
}
