//! The cluster of a run: the lab's control plane and target (from `lab::demo::LocalLab`),
//! the fault proxy (embedded, or a real Toxiproxy), and N runners whose two links —
//! to the control plane and to the target — each go through their own proxy.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lab::demo::{LabOptions, LocalLab};
use lab::launch::{self, Process};

use super::config::RunConfig;

/// Where Debian puts libfaketime.
pub const LIBFAKETIME_PATHS: [&str; 2] =
    ["/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1", "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"];

pub fn libfaketime() -> Option<PathBuf> {
    LIBFAKETIME_PATHS.iter().map(PathBuf::from).find(|path| path.exists())
}

/// How a runner's clock is moved.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClockControl {
    /// libfaketime preloaded, reading its offset from a file (FAKETIME_TIMESTAMP_FILE).
    Libfaketime { library: PathBuf },
    /// The runner's own offset file (`--clock-offset-file`).
    RunnerOffset,
}

pub struct RunnerSlot {
    pub id: String,
    pub token: String,
    pub process: Option<Process>,
    /// The offset file: seconds for libfaketime (`+120`), ms for the runner's own offset.
    pub clock_file: PathBuf,
    /// When the harness last SIGKILLed it (server-clock ms), if it did.
    pub killed_at_ms: Option<i64>,
    pub frozen_by_operator: bool,
    pub paused_by_nemesis: bool,
}

impl RunnerSlot {
    /// Whether its process is gone or stopped (SIGSTOP), that is executes nothing now.
    pub fn is_stopped(&self) -> bool {
        let Some(process) = &self.process else { return true };
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", process.pid())).unwrap_or_default();
        let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
        matches!(state, None | Some('T') | Some('t') | Some('Z') | Some('X'))
    }
}

pub struct Cluster {
    pub lab: LocalLab,
    pub proxy_server: Option<proxy::ServerHandle>,
    pub proxy: proxy::Client,
    pub runners: Vec<RunnerSlot>,
    pub clock: ClockControl,
    control_links: Vec<String>,
    target_links: Vec<String>,
    /// The throwaway PostgreSQL cluster of a `--db postgres` run, held so that it lives as
    /// long as the lab: dropping it (after the lab, declared earlier) stops and removes it.
    _database: Option<lab::pg::TempCluster>,
}

/// For a `--db postgres` run: the database the control plane uses — the given server, or
/// a throwaway cluster started now — and a schema of the run's own.
async fn start_database(config: &RunConfig, options: &mut LabOptions) -> anyhow::Result<Option<lab::pg::TempCluster>> {
    if config.db == super::config::Db::Sqlite {
        return Ok(None);
    }
    let started_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    options.schema = Some(format!("run_{}_{started_ms}", std::process::id()));
    if let Some(url) = &config.database_url {
        options.database_url = Some(url.clone());
        return Ok(None);
    }
    let cluster = tokio::task::spawn_blocking(lab::pg::TempCluster::start).await??;
    options.database_url = Some(cluster.url());
    Ok(Some(cluster))
}

pub fn control_link(index: usize) -> String {
    format!("r{}-control", index + 1)
}

pub fn target_link(index: usize) -> String {
    format!("r{}-target", index + 1)
}

impl Cluster {
    /// Starts everything; `program` is the `fencelab` binary, which runs the lab's processes
    /// as `fencelab lab ...`.
    pub async fn start(config: &RunConfig, dir: &Path, program: &Path) -> anyhow::Result<Cluster> {
        let mut options = LabOptions::new(program, dir);
        options.program_args = vec!["lab".to_string()];
        options.lease_ms = config.lease_ms;
        options.mode = config.target_mode;
        options.bugs = config.bugs.clone();
        let database = start_database(config, &mut options).await?;
        let (lab, (proxy_server, proxy)) = tokio::try_join!(LocalLab::start(options), start_proxy(config))?;
        let clock = match libfaketime() {
            Some(library) => ClockControl::Libfaketime { library },
            None => ClockControl::RunnerOffset,
        };
        let mut cluster = Cluster {
            lab,
            proxy_server,
            proxy,
            runners: vec![],
            clock,
            control_links: vec![],
            target_links: vec![],
            _database: database,
        };
        for index in 0..config.runners as usize {
            cluster.add_runner(index).await?;
        }
        cluster.check_links().await?;
        for index in 0..cluster.runners.len() {
            cluster.start_runner(index, config)?;
        }
        Ok(cluster)
    }

    /// Every proxy carries traffic: the control plane's and the target's health answer
    /// through each runner's two links.
    async fn check_links(&self) -> anyhow::Result<()> {
        for url in self.control_links.iter().chain(&self.target_links) {
            let client = protocol::client::Client::new(url, None, Duration::from_secs(5));
            client.health().await.map_err(|error| anyhow::anyhow!("link {url} is not healthy: {error}"))?;
        }
        Ok(())
    }

    async fn add_runner(&mut self, index: usize) -> anyhow::Result<()> {
        let id = format!("r{}", index + 1);
        let control_upstream = self.lab.control.addr.expect("a server has an address").to_string();
        let target_upstream = self.lab.target.addr.expect("a server has an address").to_string();
        let (control_name, target_name) = (control_link(index), target_link(index));
        if self.proxy_server.is_none() {
            // A real Toxiproxy may still hold these proxies from an earlier run.
            let _ = tokio::join!(self.proxy.delete_proxy(&control_name), self.proxy.delete_proxy(&target_name));
        }
        let (control, target) = tokio::try_join!(
            self.proxy.create_proxy(&control_name, "127.0.0.1:0", &control_upstream),
            self.proxy.create_proxy(&target_name, "127.0.0.1:0", &target_upstream),
        )?;
        self.control_links.push(format!("http://{}", control.listen_addr()?));
        self.target_links.push(format!("http://{}", target.listen_addr()?));
        let registered = self.lab.register_token(&id).await?;
        let clock_file = self.lab.options.dir.join(format!("clock-{id}"));
        std::fs::write(&clock_file, "0")?;
        self.runners.push(RunnerSlot {
            id,
            token: registered,
            process: None,
            clock_file,
            killed_at_ms: None,
            frozen_by_operator: false,
            paused_by_nemesis: false,
        });
        Ok(())
    }

    /// Starts (or starts again) runner `index` with its links through its proxies.
    pub fn start_runner(&mut self, index: usize, config: &RunConfig) -> anyhow::Result<()> {
        let slot = &self.runners[index];
        let extra = vec![
            format!("--heartbeat-interval-ms={}", config.heartbeat_interval_ms),
            format!("--renewal-margin-ms={}", config.renewal_margin_ms),
            format!("--request-timeout-ms={}", config.request_timeout_ms),
            "--result-tries-max=8".to_string(),
            "--poll-ms=50".to_string(),
        ];
        let mut command = self.lab.runner_command(
            &slot.id,
            &slot.token,
            &self.control_links[index],
            &self.target_links[index],
            &extra,
        )?;
        match &self.clock {
            ClockControl::Libfaketime { library } => {
                command.env("LD_PRELOAD", library);
                command.env("FAKETIME_TIMESTAMP_FILE", &slot.clock_file);
                command.env("FAKETIME_NO_CACHE", "1");
                command.env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
            }
            ClockControl::RunnerOffset => {
                command.arg(format!("--clock-offset-file={}", slot.clock_file.display()));
            }
        }
        let process = launch::plain(command, &slot.id)?;
        self.runners[index].process = Some(process);
        Ok(())
    }

    /// Moves runner `index`'s clock to `offset_ms` from true time.
    pub fn set_clock(&self, index: usize, offset_ms: i64) -> std::io::Result<()> {
        let text = match self.clock {
            ClockControl::Libfaketime { .. } => format!("{:+}", offset_ms as f64 / 1_000.0),
            ClockControl::RunnerOffset => offset_ms.to_string(),
        };
        std::fs::write(&self.runners[index].clock_file, text)
    }

    pub fn signal_runner(&self, index: usize, signal: i32) -> bool {
        self.runners[index].process.as_ref().is_some_and(|process| process.signal(signal))
    }

    pub fn runner_logs(&self) -> Vec<PathBuf> {
        self.runners.iter().map(|slot| self.lab.runner_log(&slot.id)).collect()
    }

    /// Stops every runner, so that the ledger and the step log can be read whole.
    pub async fn stop_runners(&mut self) {
        for slot in &mut self.runners {
            if let Some(process) = slot.process.as_mut() {
                process.signal(libc::SIGCONT);
                process.stop(Duration::from_secs(2)).await;
            }
        }
    }

    /// Stops every runner, the lab and the embedded proxy; nothing is left listening.
    pub async fn stop(&mut self) {
        self.stop_runners().await;
        self.lab.stop_all().await;
        if let Some(server) = self.proxy_server.take() {
            server.shutdown().await;
        }
    }
}

async fn start_proxy(config: &RunConfig) -> anyhow::Result<(Option<proxy::ServerHandle>, proxy::Client)> {
    if let Some(url) = &config.toxiproxy_url {
        let client = proxy::Client::new(url)?;
        client.version().await.map_err(|error| anyhow::anyhow!("--toxiproxy-url {url} is not reachable: {error}"))?;
        client.reset().await?;
        return Ok((None, client));
    }
    let server = proxy::start("127.0.0.1:0".parse()?, config.seed).await?;
    let client = proxy::Client::new(&server.url())?;
    Ok((Some(server), client))
}
