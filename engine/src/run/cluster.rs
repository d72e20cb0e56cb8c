//! The cluster of a run: the system under test (its control plane and target, started
//! from its system file), the fault proxy (embedded, or a real Toxiproxy), and N runners
//! whose two links — to the control plane and to the target — each go through their own
//! proxy.

use crate::error::RunError;
use std::path::{Path, PathBuf};
use std::time::Duration;

use system::{Launch, Proc, RunningSystem, SystemInfo};

use runfolder::config::RunConfig;
use workloads::faults::FaultKind;

pub use system::ClockControl;

pub use system::{libfaketime, LIBFAKETIME_PATHS};

/// A runner's clock file at `offset_ms` from true time, in the form its method reads:
/// libfaketime's signed seconds (`+0`, `+120`, `-30.5`; an unsigned `0` is read as an
/// absolute date, and libfaketime 0.9.10 refuses it with a newline or a space after it
/// and ends the process), the runner's own offset in ms.
/// None for clocks that cannot be moved.
pub fn clock_text(clock: &ClockControl, offset_ms: i64) -> Option<String> {
    match clock {
        ClockControl::Libfaketime { .. } | ClockControl::LibfaketimeMounted { .. } => {
            Some(format!("{:+}", offset_ms as f64 / 1_000.0))
        }
        ClockControl::RunnerOffset => Some(offset_ms.to_string()),
        ClockControl::Fixed => None,
    }
}

pub struct RunnerSlot {
    pub id: String,
    pub token: String,
    pub process: Option<Proc>,
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
        self.process.as_ref().is_none_or(Proc::is_stopped)
    }
}

pub struct Cluster {
    pub system: RunningSystem,
    pub proxy_server: Option<proxy::ServerHandle>,
    pub proxy: proxy::Client,
    /// The Toxiproxy container of a `--toxiproxy-image` run.
    proxy_container: Option<Proc>,
    pub runners: Vec<RunnerSlot>,
    pub clock: ClockControl,
    /// What the system is and what of the run it could not take.
    pub info: SystemInfo,
    /// Per runner: the address of its proxy to each replica, its own replica first.
    control_links: Vec<Vec<std::net::SocketAddr>>,
    target_links: Vec<String>,
    /// The throwaway PostgreSQL cluster of a `--db postgres` run, held so that it lives as
    /// long as the lab: dropping it (after the lab, declared earlier) stops and removes it.
    _database: Option<procs::pg::TempCluster>,
}

/// Which system a run attacks: its file, its variants (`--variant`, and `--bug` for the
/// lab), its store.
pub fn choice_of(config: &RunConfig) -> system::SystemChoice {
    let mut variants = config.variants.clone();
    variants.extend(config.bugs.iter().map(|bug| bug.name().to_string()));
    system::SystemChoice {
        system: config.system.clone(),
        variants,
        db: config.db,
        database_url: config.database_url.clone(),
    }
}

/// The run's timings, as the system is started with them.
pub fn timings_of(config: &RunConfig) -> system::Timings {
    system::Timings {
        lease_ms: config.lease_ms,
        heartbeat_interval_ms: config.heartbeat_interval_ms,
        renewal_margin_ms: config.renewal_margin_ms,
        request_timeout_ms: config.request_timeout_ms,
        target_mode: config.target_mode,
        replicas: config.control_planes as usize,
        secret: format!("capability-secret-{:016x}", config.seed),
        poll_ms: system::launch::poll_ms_for(config.runners),
    }
}

pub fn control_link(index: usize) -> String {
    format!("r{}-control", index + 1)
}

/// The proxy between runner `index` and replica `replica` (the first replica's is
/// [`control_link`]).
pub fn replica_link(index: usize, replica: usize) -> String {
    match replica {
        0 => control_link(index),
        _ => format!("r{}-control-{}", index + 1, replica + 1),
    }
}

pub fn target_link(index: usize) -> String {
    format!("r{}-target", index + 1)
}

/// The proxy between replica `replica` (0-based) and the database.
pub fn db_link(replica: usize) -> String {
    format!("db-{}", replica + 1)
}

/// `url` (a `postgres://` or `postgresql://` URL) with its host and port replaced by
/// `addr`; the user, database and parameters kept.
pub fn database_url_via(url: &str, addr: &str) -> Result<String, RunError> {
    let Some((scheme, rest)) = url.split_once("://").filter(|(scheme, _)| matches!(*scheme, "postgres" | "postgresql"))
    else {
        return Err(RunError::Failed(
            "a db-link fault needs the database URL in the form postgres://[user@]host[:port]/...".to_string(),
        ));
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let user = authority.rsplit_once('@').map(|(user, _)| format!("{user}@")).unwrap_or_default();
    Ok(format!("{scheme}://{user}{addr}{tail}"))
}

/// The database's address (`host:port`) from its URL; the first when it names several.
fn database_addr(url: &str) -> Result<String, RunError> {
    let config = std::str::FromStr::from_str(url)
        .map_err(|error: postgres::Error| RunError::Failed(format!("database URL: {error}")))
        .map(|config: postgres::Config| config)?;
    let host = match config.get_hosts().first() {
        Some(postgres::config::Host::Tcp(host)) => host.clone(),
        _ => return Err(RunError::Failed("a db-link fault needs a database reached over TCP".to_string())),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    Ok(format!("{host}:{port}"))
}

impl Cluster {
    /// Starts everything; `program` is the `fencelab` binary (`{fencelab}` in a system
    /// file: the lab's processes are `fencelab lab ...`).
    pub async fn start(config: &RunConfig, dir: &Path, program: &Path) -> Result<Cluster, RunError> {
        let choice = choice_of(config);
        let mut launch = Launch::new(&choice, &timings_of(config), dir, program)?;
        if launch.file.uses_containers() || config.toxiproxy_image.is_some() {
            system::container::sweep_dead(&system::container::docker().await?).await;
        }
        let database = system::start_database(&choice, &mut launch).await?;
        let (clock, clock_passed_over) = launch.file.check_clock(launch.file.clock_control(), &config.nemesis).await?;
        let info = SystemInfo {
            name: launch.file.name.clone(),
            file: config.system.clone(),
            variants: launch.variants.clone(),
            absent: launch.file.provides.absent(),
            faults_not_run: super::faults_not_run(config, &launch.file, &clock),
            clock_passed_over,
        };
        let (proxy_server, proxy, proxy_container) = start_proxy(config, dir).await?;
        let runs = |kind| config.nemesis.contains(&kind) && !info.faults_not_run.iter().any(|not| not.fault == kind);
        if let (true, Some(url)) = (runs(FaultKind::DbLink), launch.database_url.clone()) {
            let upstream = database_addr(&url)?;
            for replica in 0..launch.replicas.max(1) {
                let name = db_link(replica);
                if proxy_server.is_none() {
                    let _ = proxy.delete_proxy(&name).await;
                }
                let link = proxy.create_proxy(&name, "127.0.0.1:0", &upstream).await?;
                launch.database_urls.push(database_url_via(&url, &link.listen_addr()?.to_string())?);
            }
        }
        if runs(FaultKind::ReplicaClockSkew) {
            launch.replica_clock = libfaketime();
        }
        if runs(FaultKind::TargetClockSkew) {
            launch.target_clock = libfaketime();
        }
        launch.runners = config.runners as usize;
        let system = RunningSystem::start(launch).await?;
        let mut cluster = Cluster {
            system,
            proxy_server,
            proxy,
            proxy_container,
            runners: vec![],
            clock,
            info,
            control_links: vec![],
            target_links: vec![],
            _database: database,
        };
        for index in 0..config.runners as usize {
            cluster.add_runner(index).await?;
        }
        cluster.check_links().await?;
        for index in 0..cluster.runners.len() {
            cluster.start_runner(index)?;
        }
        Ok(cluster)
    }

    /// Every proxy carries traffic: the control plane's and the target's health answer
    /// through each runner's two links (a link to a runner protocol of the system's own
    /// accepts a connection through the proxy to it).
    async fn check_links(&self) -> Result<(), RunError> {
        let target_links = if self.system.target.is_some() { &self.target_links[..] } else { &[] };
        let links = self.control_links.iter().flatten();
        let http = match self.system.launch.file.runner_link {
            system::RunnerLink::Http => links.map(|addr| format!("http://{addr}")).collect(),
            system::RunnerLink::Tcp => {
                for addr in links {
                    tcp_through(*addr)
                        .await
                        .map_err(|error| RunError::Failed(format!("link {addr} is not healthy: {error}")))?;
                }
                vec![]
            }
        };
        for url in http.iter().chain(target_links) {
            let client = protocol::client::Client::new(url, None, Duration::from_secs(5));
            client.health().await.map_err(|error| RunError::Failed(format!("link {url} is not healthy: {error}")))?;
        }
        Ok(())
    }

    async fn add_runner(&mut self, index: usize) -> Result<(), RunError> {
        let id = format!("r{}", index + 1);
        let target_name = target_link(index);
        let replicas = self.system.replicas.len();
        let mut links = Vec::with_capacity(replicas);
        for replica in 0..replicas {
            let name = replica_link(index, replica);
            if self.proxy_server.is_none() {
                // A real Toxiproxy may still hold these proxies from an earlier run.
                let _ = self.proxy.delete_proxy(&name).await;
            }
            let upstream = self.system.runner_addr(replica).to_string();
            let control = self.proxy.create_proxy(&name, "127.0.0.1:0", &upstream).await?;
            links.push(control.listen_addr()?);
        }
        // Its own replica first (runners spread over the replicas), then the others in turn.
        links.rotate_left(index % replicas);
        self.control_links.push(links);
        if self.proxy_server.is_none() {
            let _ = self.proxy.delete_proxy(&target_name).await;
        }
        // A system without a target still gets a link, to nowhere: its runners never use it.
        let target_upstream =
            self.system.target.as_ref().map_or_else(|| "127.0.0.1:9".to_string(), |t| t.addr.to_string());
        let target = self.proxy.create_proxy(&target_name, "127.0.0.1:0", &target_upstream).await?;
        self.target_links.push(format!("http://{}", target.listen_addr()?));
        let registered =
            self.system.register_token(&id).await.map_err(|error| RunError::Failed(format!("{error:#}")))?;
        let clock_file = self.system.launch.dir.join(format!("clock-{id}"));
        system::launch::write_clock_file(&clock_file, &clock_text(&self.clock, 0).unwrap_or_default())
            .map_err(RunError::io("writing a runner's clock file"))?;
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
    pub fn start_runner(&mut self, index: usize) -> Result<(), RunError> {
        let slot = &self.runners[index];
        let log = self.system.runner_log(&slot.id);
        let links = &self.control_links[index];
        let control_urls = links.iter().map(|addr| format!("http://{addr}")).collect::<Vec<_>>().join(",");
        let process = self.system.launch.start_runner(&system::launch::RunnerStart {
            id: &slot.id,
            token: &slot.token,
            control_addr: links[0],
            control_urls: &control_urls,
            target_url: &self.target_links[index],
            log: &log,
            clock: &self.clock,
            clock_file: &slot.clock_file,
        })?;
        self.runners[index].process = Some(process);
        Ok(())
    }

    /// The names of runner `index`'s proxies to the control plane, one per replica.
    pub fn control_link_names(&self, index: usize) -> Vec<String> {
        (0..self.system.replicas.len()).map(|replica| replica_link(index, replica)).collect()
    }

    /// Adds `toxic` to every one of runner `index`'s links to the control plane.
    pub async fn control_add_toxic(&self, index: usize, toxic: &proxy::Toxic) -> Result<(), proxy::ClientError> {
        for name in self.control_link_names(index) {
            self.proxy.add_toxic(&name, toxic).await?;
        }
        Ok(())
    }

    /// Removes the toxic `toxic` from every one of runner `index`'s links to the control plane.
    pub async fn control_remove_toxic(&self, index: usize, toxic: &str) -> Result<(), proxy::ClientError> {
        for name in self.control_link_names(index) {
            self.proxy.remove_toxic(&name, toxic).await?;
        }
        Ok(())
    }

    /// Enables or disables every one of runner `index`'s links to the control plane.
    pub async fn control_set_enabled(&self, index: usize, enabled: bool) -> Result<(), proxy::ClientError> {
        for name in self.control_link_names(index) {
            self.proxy.set_enabled(&name, enabled).await?;
        }
        Ok(())
    }

    /// A client of the target, when the system has one.
    pub fn target_client(&self, wait: Duration) -> Option<protocol::client::Client> {
        self.system.target_url().map(|url| protocol::client::Client::new(&url, None, wait))
    }

    /// Every step the target logged; none when the system has no target.
    pub(crate) async fn target_steps(&self, wait: Duration) -> Result<Vec<protocol::StepRecord>, String> {
        match self.target_client(wait) {
            Some(target) => target.steps(10_000_000).await.map_err(|error| error.to_string()),
            None => Ok(vec![]),
        }
    }

    /// Moves replica `replica`'s clock to `offset_ms` from true time (libfaketime's file).
    pub fn set_replica_clock(&self, replica: usize, offset_ms: i64) -> std::io::Result<()> {
        let file = self.system.launch.replica_clock_file(replica);
        system::launch::write_clock_file(&file, &format!("{:+}", offset_ms as f64 / 1_000.0))
    }

    /// Moves the target's clock to `offset_ms` from true time.
    pub fn set_target_clock(&self, offset_ms: i64) -> std::io::Result<()> {
        system::launch::write_clock_file(
            &self.system.launch.target_clock_file(),
            &format!("{:+}", offset_ms as f64 / 1_000.0),
        )
    }

    /// Moves runner `index`'s clock to `offset_ms` from true time.
    pub fn set_clock(&self, index: usize, offset_ms: i64) -> std::io::Result<()> {
        let text = clock_text(&self.clock, offset_ms)
            .ok_or_else(|| std::io::Error::other("this system's runner clocks cannot be moved"))?;
        system::launch::write_clock_file(&self.runners[index].clock_file, &text)
    }

    pub fn signal_runner(&self, index: usize, signal: i32) -> bool {
        self.runners[index].process.as_ref().is_some_and(|process| process.signal(signal))
    }

    pub fn runner_logs(&self) -> Vec<PathBuf> {
        self.runners.iter().map(|slot| self.system.runner_log(&slot.id)).collect()
    }

    /// The runners whose process exited on its own (a fault's kill takes the process away,
    /// so a process still held that has exited was not killed by the harness): id, status.
    pub async fn exited_runners(&mut self) -> Vec<(String, String)> {
        let mut exited = Vec::new();
        for slot in &mut self.runners {
            let Some(process) = slot.process.as_mut() else { continue };
            if let Some(status) = process.ended().await {
                exited.push((slot.id.clone(), status));
            }
        }
        exited
    }

    /// Stops every runner, so that the ledger and the step log can be read whole.
    pub async fn stop_runners(&mut self) {
        for slot in &mut self.runners {
            if let Some(process) = slot.process.as_mut() {
                process.stop(Duration::from_secs(2)).await;
            }
        }
    }

    /// Stops every runner, the lab and the embedded proxy; nothing is left listening.
    pub async fn stop(&mut self) {
        self.stop_runners().await;
        self.system.stop().await;
        if let Some(server) = self.proxy_server.take() {
            server.shutdown().await;
        }
        if let Some(mut container) = self.proxy_container.take() {
            container.stop(Duration::from_secs(2)).await;
        }
    }
}

/// How long a connection through a proxy may take to open, and then to stay open, for the
/// link to count as carrying traffic (5 s, 200 ms).
const LINK_OPEN_MAX: Duration = Duration::from_secs(5);
const LINK_HELD_MS: u64 = 200;

/// Opens a TCP connection to `addr` (a proxy) and holds it briefly: the proxy closes a
/// connection it cannot carry to its upstream at once, so a connection still open after a
/// moment reached the system.
async fn tcp_through(addr: std::net::SocketAddr) -> Result<(), RunError> {
    use tokio::io::AsyncReadExt;
    let mut stream = tokio::time::timeout(LINK_OPEN_MAX, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| RunError::Failed(format!("no connection within {LINK_OPEN_MAX:?}")))?
        .map_err(RunError::io("connecting through the proxy"))?;
    let mut byte = [0_u8; 1];
    match tokio::time::timeout(Duration::from_millis(LINK_HELD_MS), stream.read(&mut byte)).await {
        Ok(Ok(0)) | Ok(Err(_)) => {
            Err(RunError::Failed("the proxy closed the connection: its upstream did not accept it".to_string()))
        }
        Ok(Ok(_)) | Err(_) => Ok(()),
    }
}

type Proxies = (Option<proxy::ServerHandle>, proxy::Client, Option<Proc>);

async fn start_proxy(config: &RunConfig, dir: &Path) -> Result<Proxies, RunError> {
    if let Some(url) = &config.toxiproxy_url {
        let client = proxy::Client::new(url)?;
        client
            .version()
            .await
            .map_err(|error| RunError::Failed(format!("--toxiproxy-url {url} is not reachable: {error}")))?;
        client.reset().await?;
        return Ok((None, client, None));
    }
    if let Some(image) = &config.toxiproxy_image {
        let (container, url) = system::launch::start_toxiproxy(image, dir).await?;
        let client = proxy::Client::new(&url)?;
        return Ok((None, client, Some(container)));
    }
    let any_port = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let server = proxy::start(any_port, config.seed)
        .await
        .map_err(|error| RunError::Failed(format!("starting the fault proxy: {error}")))?;
    let client = proxy::Client::new(&server.url())?;
    Ok((Some(server), client, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_runners_poll_often_and_many_poll_together_about_250_times_a_second() {
        assert_eq!(timings_of(&RunConfig::default()).poll_ms, 50, "a few runners poll every 50 ms");
        let busy = timings_of(&RunConfig { runners: 256, ..RunConfig::default() });
        assert_eq!(busy.poll_ms, 1_024, "256 idle runners claim about 250 times a second together");
    }

    #[test]
    fn a_clock_file_is_written_in_the_form_its_method_parses_at_every_offset() {
        let library = std::path::PathBuf::from("/lib/libfaketime.so.1");
        let faketime = ClockControl::Libfaketime { library };
        let texts: Vec<String> = [0, 120_000, -30_500].iter().map(|ms| clock_text(&faketime, *ms).unwrap()).collect();
        assert_eq!(texts, ["+0", "+120", "-30.5"], "a bare `0` makes libfaketime refuse to start the process");
        assert_eq!(clock_text(&ClockControl::RunnerOffset, -250).as_deref(), Some("-250"));
        assert_eq!(clock_text(&ClockControl::Fixed, 0), None);
    }

    #[test]
    fn a_database_url_is_pointed_at_a_proxy_keeping_user_database_and_parameters() {
        let url = "postgres://postgres@127.0.0.1:5432/postgres?connect_timeout=5";
        assert_eq!(
            database_url_via(url, "127.0.0.1:40001").unwrap(),
            "postgres://postgres@127.0.0.1:40001/postgres?connect_timeout=5"
        );
        assert_eq!(database_url_via("postgresql://db.local", "127.0.0.1:1").unwrap(), "postgresql://127.0.0.1:1");
        assert_eq!(database_addr(url).unwrap(), "127.0.0.1:5432");
        assert_eq!(database_addr("postgres://u@h/d").unwrap(), "h:5432");
        let error = database_url_via("host=127.0.0.1 port=5432", "127.0.0.1:1").unwrap_err().to_string();
        assert!(error.contains("postgres://"), "{error}");
    }
}
