//! Starting a system from its file: the control plane and the target as servers (ready by
//! their `{"listening": …}` line, a TCP probe or an HTTP probe, bounded), runners as plain
//! processes. Every process runs in its own process group, dies with the harness
//! (`PR_SET_PDEATHSIG`), and its whole group is killed when it is stopped or dropped, so a
//! failed start leaves nothing behind.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::file::{expand, Ready, Role, SystemFile, READY_MS_DEFAULT};
use crate::Db;

/// Why a system did not start: `Named` is what the user named wrongly (a program that is
/// not there, a variant or store the file does not declare: exit 254); `Failed` is a
/// process that did not become ready or died (exit 255).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Named(String),
    #[error("{0}")]
    Failed(String),
}

/// Everything a system's commands are built from.
#[derive(Clone, Debug)]
pub struct Launch {
    pub file: SystemFile,
    pub variants: Vec<String>,
    /// The `fencelab` binary (`{fencelab}`).
    pub program: PathBuf,
    /// The run's folder for the system's files (`{run_dir}`); each role's `{data_dir}` is
    /// a folder in it.
    pub dir: PathBuf,
    pub lease_ms: u64,
    pub target_mode: history::TargetMode,
    pub db: Db,
    pub database_url: Option<String>,
    pub schema: Option<String>,
    /// The capability secret shared by the control plane and the target (`{secret}`).
    pub secret: String,
    /// Replicas of the control plane on one store (`--control-planes`, at least 1).
    pub replicas: usize,
    pub heartbeat_interval_ms: u64,
    pub renewal_margin_ms: u64,
    pub request_timeout_ms: u64,
    pub poll_ms: u64,
    /// Per replica, the URL its `{database_url}` names (a proxy of the harness's in front
    /// of the database); empty: every replica gets `database_url`.
    pub database_urls: Vec<String>,
    /// libfaketime, preloaded into every replica so that its clock can be moved through
    /// its file [`Launch::replica_clock_file`]; `None`: replicas run on the host's clock.
    pub replica_clock: Option<PathBuf>,
    /// libfaketime, preloaded into the target so that its clock can be moved through its
    /// file [`Launch::target_clock_file`]; `None`: the target runs on the host's clock.
    pub target_clock: Option<PathBuf>,
    /// How many runners the run starts (`{runners}`; 1 until the run says).
    pub runners: usize,
    /// With `runner_link = "tcp"`: per replica, the port its runner protocol listens on
    /// (`{runner_port}`), picked once and kept across restarts.
    pub runner_ports: Vec<u16>,
}

/// Which system is started, and on what store: what a run or a conformance session names
/// of it. No system file means the built-in lab.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SystemChoice {
    pub system: Option<PathBuf>,
    /// The variants switched on (for the lab, the planted bugs by name).
    pub variants: Vec<String>,
    pub db: Db,
    /// An existing PostgreSQL server (with [`Db::Postgres`]); none: a throwaway cluster.
    pub database_url: Option<String>,
}

/// The timings and the secret a system is started with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timings {
    pub lease_ms: u64,
    pub heartbeat_interval_ms: u64,
    pub renewal_margin_ms: u64,
    pub request_timeout_ms: u64,
    /// The target's mode (`fenced`, `idempotent`, `unfenced`).
    pub target_mode: history::TargetMode,
    /// Replicas of the control plane, at least 1.
    pub replicas: usize,
    /// The capability secret (`{secret}`).
    pub secret: String,
    /// How often an idle runner claims (`{poll_ms}`).
    pub poll_ms: u64,
}

/// How often each idle runner of `runners` claims: every 50 ms, and slower as runners are
/// added, so that idle runners together send at most about 250 claims a second (256
/// runners at 50 ms would flood a control plane with 5,000 claims a second of nothing).
pub fn poll_ms_for(runners: u32) -> u64 {
    u64::from(runners).saturating_mul(4).max(50)
}

impl Launch {
    /// What a system is started from: its file (the built-in lab unless one is named), its
    /// variants, the timings; `dir` holds its files, `program` is the `fencelab` binary. An
    /// unknown variant, or one the store cannot take, is [`StartError::Named`].
    pub fn new(choice: &SystemChoice, timings: &Timings, dir: &Path, program: &Path) -> Result<Launch, StartError> {
        let file = SystemFile::of_choice(choice.system.as_deref())?;
        file.check_variants(&choice.variants).map_err(|error| StartError::Named(error.to_string()))?;
        file.db_args(choice.db).map_err(|error| StartError::Named(error.to_string()))?;
        Ok(Launch {
            file,
            variants: choice.variants.clone(),
            program: program.to_path_buf(),
            dir: std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf()),
            lease_ms: timings.lease_ms,
            target_mode: timings.target_mode,
            db: choice.db,
            database_url: None,
            schema: None,
            secret: timings.secret.clone(),
            replicas: timings.replicas.max(1),
            heartbeat_interval_ms: timings.heartbeat_interval_ms,
            renewal_margin_ms: timings.renewal_margin_ms,
            request_timeout_ms: timings.request_timeout_ms,
            poll_ms: timings.poll_ms,
            database_urls: vec![],
            replica_clock: None,
            target_clock: None,
            runners: 1,
            runner_ports: vec![],
        })
    }
}

/// For a PostgreSQL store: the database the control plane uses — the given server, or a
/// throwaway cluster started now, held by the caller as long as the system lives — and a
/// schema of its own. Nothing for SQLite.
pub async fn start_database(
    choice: &SystemChoice,
    launch: &mut Launch,
) -> Result<Option<procs::pg::TempCluster>, StartError> {
    if choice.db == Db::Sqlite {
        return Ok(None);
    }
    let started_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    launch.schema = Some(format!("run_{}_{started_ms}", std::process::id()));
    if let Some(url) = &choice.database_url {
        launch.database_url = Some(url.clone());
        return Ok(None);
    }
    let failed = |error: String| StartError::Failed(format!("the throwaway PostgreSQL cluster: {error}"));
    let cluster = tokio::task::spawn_blocking(procs::pg::TempCluster::start)
        .await
        .map_err(|error| failed(error.to_string()))?
        .map_err(|error| failed(error.to_string()))?;
    launch.database_url = Some(cluster.url());
    Ok(Some(cluster))
}

/// Tries a runner makes to deliver a result (`{result_tries_max}`): with its back-off they
/// outlast the longest link cut of the schedule (3 leases), so a late result is sent late
/// rather than never.
pub const RESULT_TRIES_MAX: u32 = 8;

/// Starts of a server on a port picked for it, when the port was taken before it bound it.
const PORT_TRIES_MAX: u32 = 3;

/// A process the harness started — its whole process group is SIGKILLed when dropped — or
/// a container (`image`), removed when dropped.
pub struct Proc {
    body: Body,
    pub name: String,
}

enum Body {
    Child(Child),
    Container(Box<super::container::Container>),
}

impl Proc {
    pub fn new(child: Child, name: String) -> Proc {
        Proc { body: Body::Child(child), name }
    }

    pub(super) fn container(container: super::container::Container, name: String) -> Proc {
        Proc { body: Body::Container(Box::new(container)), name }
    }

    /// Its pid (a container's first process, as the host sees it).
    pub fn pid(&self) -> i32 {
        match &self.body {
            Body::Child(child) => child.id().map_or(0, |pid| pid as i32),
            Body::Container(container) => container.pid,
        }
    }

    /// Sends a signal to the process (not its group); a container is paused (SIGSTOP) and
    /// resumed (SIGCONT) through the cgroup freezer.
    pub fn signal(&self, signal: i32) -> bool {
        if let Body::Container(container) = &self.body {
            return container.signal(signal);
        }
        let pid = self.pid();
        // SAFETY: kill(2) with a pid we started; a stale pid only yields an error.
        pid > 0 && unsafe { libc::kill(pid, signal) } == 0
    }

    /// How it ended, if it has (a process: its exit status, reaped here; a container: why
    /// it no longer runs).
    pub async fn ended(&mut self) -> Option<String> {
        match &mut self.body {
            Body::Child(child) => child.try_wait().ok().flatten().map(|status| status.to_string()),
            Body::Container(container) => container.exited().await,
        }
    }

    /// Whether it executes nothing now: gone, stopped (SIGSTOP) or paused.
    pub fn is_stopped(&self) -> bool {
        if let Body::Container(container) = &self.body {
            return container.is_stopped();
        }
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
        matches!(state, None | Some('T') | Some('t') | Some('Z') | Some('X'))
    }

    fn kill_group(&self) {
        let pid = self.pid();
        if pid > 0 && matches!(self.body, Body::Child(_)) {
            // SAFETY: the child leads its own group (setpgid in pre_exec).
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }

    /// SIGKILLs its group and reaps it (a container: killed and removed).
    pub async fn kill(&mut self) {
        self.kill_group();
        match &mut self.body {
            Body::Child(child) => {
                let _ = child.kill().await;
            }
            Body::Container(container) => container.kill().await,
        }
    }

    /// SIGCONT and SIGTERM, then SIGKILL of its group if it has not exited within `grace`
    /// (a container: resumed, stopped, removed).
    pub async fn stop(&mut self, grace: Duration) {
        let child = match &mut self.body {
            Body::Child(child) => child,
            Body::Container(container) => return container.stop(grace).await,
        };
        let pid = child.id().map_or(0, |pid| pid as i32);
        if pid > 0 {
            // SAFETY: kill(2) with a pid we started.
            unsafe {
                libc::kill(pid, libc::SIGCONT);
                libc::kill(pid, libc::SIGTERM);
            }
        }
        if tokio::time::timeout(grace, child.wait()).await.is_err() {
            self.kill().await;
        }
        self.kill_group();
    }

    /// Why it is no longer running, if it is not.
    pub(super) async fn exited(&mut self) -> Option<String> {
        match &mut self.body {
            Body::Child(child) => match child.try_wait() {
                Ok(Some(status)) => Some(exited(Ok(status))),
                _ => None,
            },
            Body::Container(container) => container.exited().await,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Body::Child(child) = &mut self.body {
            if matches!(child.try_wait(), Ok(None)) {
                self.kill_group();
            }
        }
    }
}

/// A role's expanded words and environment.
type WordsEnv = (Vec<String>, Vec<(String, String)>);

/// A started server.
pub struct Server {
    pub proc: Proc,
    pub addr: SocketAddr,
}

impl Server {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Picks a free loopback port (bind to 0, read it, release it).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Launch {
    /// Placeholder values every role has.
    fn values(&self, role: Role) -> BTreeMap<&'static str, String> {
        let mut values = BTreeMap::new();
        values.insert("fencelab", self.program.display().to_string());
        values.insert("system_dir", self.file.dir().display().to_string());
        values.insert("data_dir", self.data_dir(role).display().to_string());
        values.insert("run_dir", self.dir.display().to_string());
        values.insert("operator_token", self.file.operator_token.clone());
        values.insert("project", self.file.project.clone());
        values.insert("secret", self.secret.clone());
        values.insert("lease_ms", self.lease_ms.to_string());
        values.insert("runners", self.runners.to_string());
        match role {
            Role::ControlPlane => {
                values.insert("database_url", self.database_url.clone().unwrap_or_default());
                values.insert("schema", self.schema.clone().unwrap_or_default());
                values.insert("runner_port", String::new());
            }
            Role::Target => {
                values.insert("target_mode", self.target_mode.to_string());
                values.insert("step_log", self.data_dir(role).join("steps.jsonl").display().to_string());
            }
            Role::Runner => {
                values.insert("heartbeat_interval_ms", self.heartbeat_interval_ms.to_string());
                values.insert("renewal_margin_ms", self.renewal_margin_ms.to_string());
                values.insert("request_timeout_ms", self.request_timeout_ms.to_string());
                values.insert("poll_ms", self.poll_ms.to_string());
                values.insert("result_tries_max", RESULT_TRIES_MAX.to_string());
            }
        }
        values
    }

    /// The role's own folder (created on first use, kept across restarts).
    pub fn data_dir(&self, role: Role) -> PathBuf {
        self.dir.join(role.name())
    }

    /// The words and environment for `role`: its command, the store's words (control
    /// plane), each variant's words, `extra_words`, expanded with `values`.
    fn words_env(
        &self,
        role: Role,
        extra_values: &[(&'static str, String)],
        extra_words: &[String],
    ) -> Result<WordsEnv, StartError> {
        let file = &self.file;
        let spec = &file.roles[&role];
        let where_ = file.locate(role);
        let mut values = self.values(role);
        values.extend(extra_values.iter().cloned());
        let mut words: Vec<String> = spec.command.get_ref().clone();
        if role == Role::ControlPlane {
            words.extend(file.db_args(self.db).map_err(|error| StartError::Named(error.to_string()))?.iter().cloned());
        }
        let mut env = spec.env.clone();
        for name in &self.variants {
            let variant = file.variants.get(name).ok_or_else(|| {
                StartError::Named(file.check_variants(std::slice::from_ref(name)).unwrap_err().to_string())
            })?;
            words.extend(variant.extra(role).args.iter().cloned());
            env.extend(variant.extra(role).env.clone());
        }
        words.extend(extra_words.iter().cloned());
        let expand_all =
            |word: &String| expand(word, &values).map_err(|error| StartError::Named(format!("{where_}: {error}")));
        let words = words.iter().map(expand_all).collect::<Result<Vec<String>, StartError>>()?;
        let env = env
            .iter()
            .map(|(key, value)| Ok((key.clone(), expand_all(value)?)))
            .collect::<Result<Vec<(String, String)>, StartError>>()?;
        std::fs::create_dir_all(self.data_dir(role))
            .map_err(|error| StartError::Failed(format!("{where_}: cannot create its data folder: {error}")))?;
        Ok((words, env))
    }

    /// The command for `role` (see [`Launch::words_env`]); stderr to `log`.
    fn command(
        &self,
        role: Role,
        extra_values: &[(&'static str, String)],
        extra_words: &[String],
        log: &Path,
    ) -> Result<(Command, String), StartError> {
        let file = &self.file;
        let spec = &file.roles[&role];
        let where_ = file.locate(role);
        let (words, env) = self.words_env(role, extra_values, extra_words)?;
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|error| StartError::Failed(format!("{}: {error}", log.display())))?;
        let mut command = procs::launch::command(Path::new(&words[0]), &words[1..], None)
            .map_err(|error| StartError::Failed(format!("{where_}: {error}")))?;
        command.stderr(Stdio::from(stderr));
        let cwd = match &spec.cwd {
            Some(cwd) => {
                let cwd =
                    expand(cwd, &self.values(role)).map_err(|error| StartError::Named(format!("{where_}: {error}")))?;
                file.dir().join(cwd)
            }
            None => file.dir(),
        };
        command.current_dir(cwd);
        for (key, value) in &env {
            command.env(key, value);
        }
        Ok((command, words.join(" ")))
    }

    /// Starts `role` as a container of its image: the run's folder (and the system file's,
    /// read-only) mounted at the same paths, output appended to `log`.
    async fn start_container(
        &self,
        role: Role,
        name: &str,
        (words, env): WordsEnv,
        files: Vec<(PathBuf, String)>,
        log: &Path,
    ) -> Result<Proc, StartError> {
        let where_ = self.file.locate(role);
        let image = self.file.image(role).expect("a role with an image");
        let image = super::container::ImageName::parse(image).map_err(|why| StartError::Named(why.to_string()))?;
        let mut mounts = vec![(self.dir.clone(), false)];
        if !self.dir.starts_with(self.file.dir()) {
            mounts.push((self.file.dir(), true));
        }
        let spec = super::container::Spec {
            image,
            command: words,
            env,
            mounts,
            files,
            run: self.dir.parent().unwrap_or(&self.dir).to_path_buf(),
            role: name.to_string(),
            log: log.to_path_buf(),
        };
        let container = super::container::Container::start(spec, &where_).await?;
        Ok(Proc::container(container, name.to_string()))
    }

    /// Starts a server for `role` (replica `replica`, 0-based, of the control plane) on
    /// `port` (0: a free one is picked) and waits, bounded, until it is ready.
    pub async fn start_server(&self, role: Role, replica: usize, port: u16) -> Result<Server, StartError> {
        // A port picked here is free when picked, not when the server binds it: another
        // process may take it in between. Such a start is tried again on another port.
        let mut tries = 0;
        loop {
            tries += 1;
            match self.start_server_once(role, replica, port).await {
                Err(StartError::Failed(why)) if port == 0 && tries < PORT_TRIES_MAX && why.contains("in use") => {
                    continue
                }
                done => return done,
            }
        }
    }

    /// The libfaketime offset file of replica `replica` (0-based).
    pub fn replica_clock_file(&self, replica: usize) -> PathBuf {
        self.dir.join(format!("clock-control-plane-{}", replica + 1))
    }

    /// The libfaketime offset file of the target.
    pub fn target_clock_file(&self) -> PathBuf {
        self.dir.join("clock-target")
    }

    async fn start_server_once(&self, role: Role, replica: usize, port: u16) -> Result<Server, StartError> {
        let where_ = self.file.locate(role);
        let spec = &self.file.roles[&role];
        let port = if port == 0 { free_port().map_err(|error| StartError::Failed(error.to_string()))? } else { port };
        let mut values = vec![
            ("host", "127.0.0.1".to_string()),
            ("port", port.to_string()),
            ("listen", format!("127.0.0.1:{port}")),
            ("replica", (replica + 1).to_string()),
        ];
        if let (Role::ControlPlane, Some(url)) = (role, self.database_urls.get(replica)) {
            values.push(("database_url", url.clone()));
        }
        if let (Role::ControlPlane, Some(runner_port)) = (role, self.runner_ports.get(replica)) {
            values.push(("runner_port", runner_port.to_string()));
        }
        let log = match replica {
            0 => self.dir.join(format!("{}.log", role_log_name(role))),
            _ => self.dir.join(format!("{}-{}.log", role_log_name(role), replica + 1)),
        };
        if self.file.image(role).is_some() {
            let words_env = self.words_env(role, &values, &[])?;
            let words = words_env.0.join(" ");
            let proc = self.start_container(role, role.name(), words_env, vec![], &log).await?;
            // A container's stdout goes to its log: `listening` is judged by a TCP probe.
            let ready = match spec.ready.clone().unwrap_or(Ready::Listening) {
                Ready::Listening => Ready::Tcp,
                ready => ready,
            };
            return self.wait_ready(role, proc, port, ready, &words, &log).await;
        }
        let (mut command, words) = self.command(role, &values, &[], &log)?;
        let faked = match role {
            Role::ControlPlane => {
                self.replica_clock.as_ref().map(|library| (library, self.replica_clock_file(replica)))
            }
            Role::Target => self.target_clock.as_ref().map(|library| (library, self.target_clock_file())),
            Role::Runner => None,
        };
        if let Some((library, clock_file)) = faked {
            if !clock_file.exists() {
                write_clock_file(&clock_file, "+0").map_err(|error| StartError::Failed(error.to_string()))?;
            }
            command.env("LD_PRELOAD", library);
            command.env("FAKETIME_TIMESTAMP_FILE", &clock_file);
            command.env("FAKETIME_NO_CACHE", "1");
            command.env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let ready = spec.ready.clone().unwrap_or(Ready::Listening);
        if ready != Ready::Listening {
            let stdout = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .map_err(|error| StartError::Failed(error.to_string()))?;
            command.stdout(Stdio::from(stdout));
        }
        let child = command.spawn().map_err(|error| spawn_error(&where_, &words, error))?;
        let proc = Proc::new(child, role.name().to_string());
        self.wait_ready(role, proc, port, ready, &words, &log).await
    }

    /// Waits, bounded by the role's `ready_ms`, until `proc` is ready; kills it if it is not.
    async fn wait_ready(
        &self,
        role: Role,
        mut proc: Proc,
        port: u16,
        ready: Ready,
        words: &str,
        log: &Path,
    ) -> Result<Server, StartError> {
        let where_ = self.file.locate(role);
        let spec = &self.file.roles[&role];
        let wait = Duration::from_millis(spec.ready_ms.unwrap_or(READY_MS_DEFAULT));
        let path = spec.ready_path.clone().unwrap_or_else(|| "/v1/health".to_string());
        let probe = async {
            match ready {
                Ready::Listening => listening(&mut proc).await,
                Ready::Tcp => {
                    probe_until(&mut proc, || tcp_ready(port)).await.map(|()| SocketAddr::from(([127, 0, 0, 1], port)))
                }
                Ready::Http => probe_until(&mut proc, || http_ready(port, &path))
                    .await
                    .map(|()| SocketAddr::from(([127, 0, 0, 1], port))),
            }
        };
        let addr = match tokio::time::timeout(wait, probe).await {
            Ok(Ok(addr)) => addr,
            Ok(Err(why)) => {
                proc.kill().await;
                return Err(StartError::Failed(format!("{where_}: {why}{}", log_tail(log))));
            }
            Err(_) => {
                proc.kill().await;
                let how = match ready {
                    Ready::Listening => "announce `{\"listening\": ADDR}` on stdout".to_string(),
                    Ready::Tcp => format!("accept a TCP connection on 127.0.0.1:{port}"),
                    Ready::Http => format!("answer 2xx to GET http://127.0.0.1:{port}{path}"),
                };
                return Err(StartError::Failed(format!(
                    "{where_}: `{words}` did not {how} within {} ms{}",
                    wait.as_millis(),
                    log_tail(log)
                )));
            }
        };
        Ok(Server { proc, addr })
    }

    /// The command of runner `id`, with its links (the control plane's as a comma-separated
    /// list, its own replica first), token, log and clock words.
    pub fn runner_command(&self, runner: &RunnerStart<'_>) -> Result<(Command, String), StartError> {
        let values = self.runner_values(runner);
        let extra =
            if *runner.clock == ClockControl::RunnerOffset { self.file.runner_clock_args.clone() } else { vec![] };
        let stderr_log = self.dir.join(format!("runner-{}.log", runner.id));
        let (mut command, words) = self.command(Role::Runner, &values, &extra, &stderr_log)?;
        if let ClockControl::Libfaketime { library } = runner.clock {
            command.env("LD_PRELOAD", library);
            command.env("FAKETIME_TIMESTAMP_FILE", runner.clock_file);
            command.env("FAKETIME_NO_CACHE", "1");
            command.env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        command.stdout(Stdio::null());
        Ok((command, words))
    }

    /// Starts runner `id` (a container when the runner has an image: from synchronous code,
    /// so it waits for the daemon inside the harness's multi-thread runtime).
    pub fn start_runner(&self, runner: &RunnerStart<'_>) -> Result<Proc, StartError> {
        if self.file.image(Role::Runner).is_some() {
            let start = self.start_runner_container(runner);
            return super::container::block_on(start).unwrap_or_else(|| {
                Err(StartError::Failed("a runner's container is started only inside a multi-thread runtime".into()))
            });
        }
        let (mut command, words) = self.runner_command(runner)?;
        let child = command.spawn().map_err(|error| spawn_error(&self.file.locate(Role::Runner), &words, error))?;
        Ok(Proc::new(child, format!("runner {}", runner.id)))
    }

    /// Runner `id` as a container of the runner's image; with libfaketime, the host's
    /// library mounted at [`super::container::FAKETIME_MOUNT`] and preloaded.
    async fn start_runner_container(&self, runner: &RunnerStart<'_>) -> Result<Proc, StartError> {
        let values = self.runner_values(runner);
        let extra =
            if *runner.clock == ClockControl::RunnerOffset { self.file.runner_clock_args.clone() } else { vec![] };
        let (words, mut env) = self.words_env(Role::Runner, &values, &extra)?;
        let mut files = vec![];
        if let ClockControl::LibfaketimeMounted { library, mounted_at } = runner.clock {
            files.push((library.clone(), mounted_at.clone()));
            env.extend([
                ("LD_PRELOAD".to_string(), mounted_at.clone()),
                ("FAKETIME_TIMESTAMP_FILE".to_string(), runner.clock_file.display().to_string()),
                ("FAKETIME_NO_CACHE".to_string(), "1".to_string()),
                ("FAKETIME_DONT_FAKE_MONOTONIC".to_string(), "1".to_string()),
            ]);
        }
        let stderr_log = self.dir.join(format!("runner-{}.log", runner.id));
        self.start_container(Role::Runner, &format!("runner {}", runner.id), (words, env), files, &stderr_log).await
    }

    fn runner_values(&self, runner: &RunnerStart<'_>) -> [(&'static str, String); 9] {
        [
            ("control_host", runner.control_addr.ip().to_string()),
            ("control_port", runner.control_addr.port().to_string()),
            ("runner_id", runner.id.to_string()),
            ("runner_token", runner.token.to_string()),
            ("control_url", runner.control_urls.split(',').next().unwrap_or_default().to_string()),
            ("control_urls", runner.control_urls.to_string()),
            ("target_url", runner.target_url.to_string()),
            ("runner_log", runner.log.display().to_string()),
            ("clock_file", runner.clock_file.display().to_string()),
        ]
    }
}

/// What a runner is started with: its identity, its links (the control plane's as a
/// comma-separated list, its own replica first), its log and how its clock is moved.
pub struct RunnerStart<'a> {
    pub id: &'a str,
    pub token: &'a str,
    /// Its own proxy to its own replica (`{control_host}`, `{control_port}`).
    pub control_addr: SocketAddr,
    pub control_urls: &'a str,
    pub target_url: &'a str,
    pub log: &'a Path,
    pub clock: &'a ClockControl,
    pub clock_file: &'a Path,
}

/// Where Debian puts libfaketime: its build for programs with threads first. Runners,
/// targets and control planes run several threads, and the other build reads the clock
/// file into state the threads share unguarded: beside a thread reading the clock, one
/// read after a move could still give the old offset (measured: 4 threads reading while the
/// file moved 40 times, 7 to 9 moves with such a read; the threaded build, none).
pub const LIBFAKETIME_PATHS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
];

/// Writes a clock file whole: a process reading it at any moment reads the old offset or
/// the new one, never an empty file (which libfaketime and the runner's own offset read as
/// no offset).
pub fn write_clock_file(path: &Path, text: &str) -> std::io::Result<()> {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, path)
}

/// The variable that names libfaketime's library where Debian does not put it, or `none`
/// for a run that must not use it (as on a host without it).
pub const LIBFAKETIME_VARIABLE: &str = "FENCELAB_LIBFAKETIME";

/// libfaketime on this host, if installed: the library `FENCELAB_LIBFAKETIME` names (none
/// when it says `none`, or names no file), else the first of [`LIBFAKETIME_PATHS`] there.
pub fn libfaketime() -> Option<PathBuf> {
    match std::env::var_os(LIBFAKETIME_VARIABLE) {
        Some(named) if named == "none" => None,
        Some(named) => Some(PathBuf::from(named)).filter(|path| path.is_file()),
        None => LIBFAKETIME_PATHS.iter().map(PathBuf::from).find(|path| path.exists()),
    }
}

/// How a runner's clock is moved.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClockControl {
    /// libfaketime preloaded, reading its offset from a file (FAKETIME_TIMESTAMP_FILE).
    Libfaketime { library: PathBuf },
    /// A runner's container: the host's libfaketime mounted read-only at `mounted_at`,
    /// preloaded, reading the same offset file (mounted with the run's folder).
    LibfaketimeMounted { library: PathBuf, mounted_at: String },
    /// The runner's own offset file (the system file's `runner_clock_args`).
    RunnerOffset,
    /// Runner clocks cannot be moved: the system provides no way, or this host has no
    /// libfaketime for a system that offers only that.
    Fixed,
}

fn role_log_name(role: Role) -> &'static str {
    match role {
        Role::ControlPlane => "control",
        Role::Target => "target",
        Role::Runner => "runner",
    }
}

fn spawn_error(where_: &str, words: &str, error: std::io::Error) -> StartError {
    let message = format!("{where_}: cannot start `{words}`: {error}");
    match error.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => StartError::Named(message),
        _ => StartError::Failed(message),
    }
}

/// The last lines of a role's log, for an error message.
pub(super) fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    if lines.is_empty() {
        return String::new();
    }
    let tail: Vec<&str> = lines.into_iter().rev().collect();
    format!(" (its log {} ends: {})", log.display(), tail.join(" | "))
}

/// Reads the first stdout line: `{"listening": "HOST:PORT"}`; then keeps draining stdout.
async fn listening(proc: &mut Proc) -> Result<SocketAddr, String> {
    let Body::Child(child) = &mut proc.body else { return Err("a container's stdout is its log".into()) };
    let stdout = child.stdout.take().ok_or("its stdout is not piped")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::select! {
        line = lines.next_line() => line.map_err(|error| error.to_string())?,
        status = child.wait() => return Err(exited(status)),
    };
    let Some(said) = line else {
        // Its stdout closed: most likely it is exiting; say how, if it does so soon.
        return match tokio::time::timeout(Duration::from_secs(1), child.wait()).await {
            Ok(status) => Err(exited(status)),
            Err(_) => Err("it closed its stdout before announcing an address".to_string()),
        };
    };
    let addr = serde_json::from_str::<serde_json::Value>(&said)
        .ok()
        .and_then(|value| value["listening"].as_str().and_then(|addr| addr.parse::<SocketAddr>().ok()))
        .ok_or_else(|| format!("its first stdout line is not `{{\"listening\": \"HOST:PORT\"}}`: {said:?}"))?;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(addr)
}

fn exited(status: std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(status) => format!("it exited ({status}) before it was ready"),
        Err(error) => format!("it could not be waited for: {error}"),
    }
}

/// Polls `probe` every 25 ms until it holds, failing when the process exits first (the
/// caller bounds the whole wait).
async fn probe_until<F, Fut>(proc: &mut Proc, probe: F) -> Result<(), String>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    loop {
        if let Some(why) = proc.exited().await {
            // A container's last words reach its log through the daemon: let them land.
            tokio::time::sleep(Duration::from_millis(300)).await;
            return Err(why);
        }
        if probe().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn tcp_ready(port: u16) -> bool {
    let connect = tokio::net::TcpStream::connect(("127.0.0.1", port));
    matches!(tokio::time::timeout(Duration::from_millis(500), connect).await, Ok(Ok(_)))
}

/// A bare HTTP/1.1 GET; true on a 2xx status line.
pub(super) async fn http_ready(port: u16, path: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        Some(head.starts_with(b"HTTP/1.") && head[9] == b'2')
    };
    matches!(tokio::time::timeout(Duration::from_millis(500), exchange).await, Ok(Some(true)))
}

/// Longest wait for a Toxiproxy container's API (20 s).
const TOXIPROXY_READY_MAX: Duration = Duration::from_secs(20);

/// Runs a Toxiproxy server from `image` on a free loopback port (`--host=127.0.0.1
/// --port=PORT`, the flags of Shopify's `toxiproxy` and of `fencelab toxiproxy`) and waits,
/// bounded, until `GET /version` answers; its output goes to `dir/toxiproxy.log`.
pub async fn start_toxiproxy(image: &str, dir: &Path) -> Result<(Proc, String), StartError> {
    let where_ = format!("--toxiproxy-image {image}");
    let name =
        super::container::ImageName::parse(image).map_err(|why| StartError::Named(format!("{where_}: {why}")))?;
    std::fs::create_dir_all(dir).map_err(|error| StartError::Failed(format!("{}: {error}", dir.display())))?;
    let port = free_port().map_err(|error| StartError::Failed(error.to_string()))?;
    let log = dir.join("toxiproxy.log");
    let spec = super::container::Spec {
        image: name,
        command: vec!["--host=127.0.0.1".to_string(), format!("--port={port}")],
        env: vec![],
        mounts: vec![],
        files: vec![],
        run: dir.parent().unwrap_or(dir).to_path_buf(),
        role: "toxiproxy".to_string(),
        log: log.clone(),
    };
    let container = super::container::Container::start(spec, &where_).await?;
    let mut proc = Proc::container(container, "toxiproxy".to_string());
    let deadline = tokio::time::Instant::now() + TOXIPROXY_READY_MAX;
    loop {
        if http_ready(port, "/version").await {
            return Ok((proc, format!("http://127.0.0.1:{port}")));
        }
        let why = match proc.exited().await {
            Some(why) => Some(why),
            None if tokio::time::Instant::now() >= deadline => {
                Some(format!("GET http://127.0.0.1:{port}/version did not answer within {TOXIPROXY_READY_MAX:?}"))
            }
            None => None,
        };
        if let Some(why) = why {
            tokio::time::sleep(Duration::from_millis(300)).await;
            proc.kill().await;
            return Err(StartError::Failed(format!("{where_}: {why}{}", log_tail(&log))));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
