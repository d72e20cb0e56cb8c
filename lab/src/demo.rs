//! A whole lab on loopback — control plane, target and runners as real processes — for the
//! demo command and for the lab's own end-to-end tests.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::bugs::Bug;
use crate::target::Mode;
use procs::launch::{self, Process};
use protocol::client::Client;
use protocol::*;

/// The operator token and capability secret of a local lab.
pub const OPERATOR_TOKEN: &str = "operator-local";
pub const CAPABILITY_SECRET: &str = "capability-secret-local";
pub const PROJECT: &str = "demo";

#[derive(Clone, Debug)]
pub struct LabOptions {
    pub program: PathBuf,
    /// Arguments before the subcommand (`["lab"]` when the program is `fencelab`).
    pub program_args: Vec<String>,
    pub dir: PathBuf,
    pub lease_ms: u64,
    pub mode: Mode,
    pub bugs: Vec<Bug>,
    /// The control plane's store: `None` for the SQLite file in `dir` (the default), or a
    /// PostgreSQL URL (`--database-url`).
    pub database_url: Option<String>,
    /// With `database_url`: the schema (`--schema`; the control plane's default when `None`).
    pub schema: Option<String>,
}

impl LabOptions {
    pub fn new(program: &Path, dir: &Path) -> LabOptions {
        LabOptions {
            program: program.to_path_buf(),
            program_args: vec![],
            dir: dir.to_path_buf(),
            lease_ms: crate::control::Policy::default().lease_ms,
            mode: Mode::Fenced,
            bugs: vec![],
            database_url: None,
            schema: None,
        }
    }

    /// A lab process's command: the program, its prefix arguments, then `args`.
    pub fn command(&self, args: &[String], stderr_log: &Path) -> std::io::Result<tokio::process::Command> {
        let all: Vec<&String> = self.program_args.iter().chain(args).collect();
        launch::command(&self.program, &all, Some(stderr_log))
    }

    fn bug_args(&self, home: crate::bugs::Home) -> Vec<String> {
        self.bugs
            .iter()
            .filter(|bug| bug.home() == home)
            .flat_map(|bug| ["--bug".to_string(), bug.name().to_string()])
            .collect()
    }
}

pub struct LocalLab {
    pub options: LabOptions,
    pub control: Process,
    pub target: Process,
    pub operator: Client,
    pub runners: Vec<Process>,
}

impl LocalLab {
    /// Starts the control plane and the target, and creates the project.
    pub async fn start(options: LabOptions) -> anyhow::Result<LocalLab> {
        std::fs::create_dir_all(&options.dir)?;
        let control = Self::start_control(&options, 0).await?;
        let mut target_args =
            vec!["target".to_string(), "--listen=127.0.0.1:0".into(), format!("--secret={CAPABILITY_SECRET}")];
        target_args.push(format!("--mode={}", serde_json::to_value(options.mode)?.as_str().unwrap_or("fenced")));
        target_args.push(format!("--step-log={}", options.dir.join("steps.jsonl").display()));
        target_args.extend(options.bug_args(crate::bugs::Home::Target));
        let command = options.command(&target_args, &options.dir.join("target.log"))?;
        let target = launch::server(command, "target").await?;
        let url = format!("http://{}", control.addr.expect("a server has an address"));
        let operator = Client::new(&url, Some(OPERATOR_TOKEN), Duration::from_secs(5));
        operator.create_project(PROJECT).await?;
        Ok(LocalLab { options, control, target, operator, runners: vec![] })
    }

    /// Starts a control plane on the lab's store; `port` 0 picks a free one.
    async fn start_control(options: &LabOptions, port: u16) -> anyhow::Result<Process> {
        let mut args = vec!["control-plane".to_string(), format!("--listen=127.0.0.1:{port}")];
        match &options.database_url {
            None => args.push(format!("--db={}", options.dir.join("control.sqlite").display())),
            Some(url) => {
                args.push(format!("--database-url={url}"));
                args.extend(options.schema.iter().map(|schema| format!("--schema={schema}")));
            }
        }
        args.extend([format!("--operator-token={OPERATOR_TOKEN}"), format!("--secret={CAPABILITY_SECRET}")]);
        args.push(format!("--lease-ms={}", options.lease_ms));
        args.extend(options.bug_args(crate::bugs::Home::ControlPlane));
        let command = options.command(&args, &options.dir.join("control.log"))?;
        Ok(launch::server(command, "control-plane").await?)
    }

    /// Starts one more control plane on the lab's store (a replica); returns it. It is the
    /// caller's to stop.
    pub async fn start_replica(&self) -> anyhow::Result<Process> {
        Self::start_control(&self.options, 0).await
    }

    /// Kills the control plane (SIGKILL) and starts it again on the same store and port.
    pub async fn restart_control(&mut self) -> anyhow::Result<()> {
        let port = self.control.addr.expect("a server has an address").port();
        self.control.kill().await;
        self.control = Self::start_control(&self.options, port).await?;
        Ok(())
    }

    pub fn control_url(&self) -> String {
        format!("http://{}", self.control.addr.expect("a server has an address"))
    }

    pub fn target_url(&self) -> String {
        format!("http://{}", self.target.addr.expect("a server has an address"))
    }

    /// Registers a runner and returns its token.
    pub async fn register_token(&self, id: &str) -> anyhow::Result<String> {
        let request = RegisterRunner { project: Some(PROJECT.to_string()), id: id.to_string() };
        Ok(self.operator.register_runner(&request).await?.token)
    }

    /// Registers a runner and returns a client holding its token.
    pub async fn register(&self, id: &str) -> anyhow::Result<Client> {
        let request = RegisterRunner { project: Some(PROJECT.to_string()), id: id.to_string() };
        let registered = self.operator.register_runner(&request).await?;
        Ok(self.operator.with_token(&registered.token))
    }

    /// Registers and starts a runner process with extra flags.
    pub async fn spawn_runner(&mut self, id: &str, extra: &[String]) -> anyhow::Result<()> {
        let (control, target) = (self.control_url(), self.target_url());
        self.spawn_runner_at(id, &control, &target, extra).await
    }

    /// Registers and starts a runner that reaches the control plane and the target at the
    /// given URLs (for instance through fault proxies).
    pub async fn spawn_runner_at(
        &mut self,
        id: &str,
        control_url: &str,
        target_url: &str,
        extra: &[String],
    ) -> anyhow::Result<()> {
        let request = RegisterRunner { project: Some(PROJECT.to_string()), id: id.to_string() };
        let token = self.operator.register_runner(&request).await?.token;
        let command = self.runner_command(id, &token, control_url, target_url, extra)?;
        self.runners.push(launch::plain(command, id)?);
        Ok(())
    }

    /// The command that runs a registered runner; its log goes to `runner-ID.jsonl`.
    pub fn runner_command(
        &self,
        id: &str,
        token: &str,
        control_url: &str,
        target_url: &str,
        extra: &[String],
    ) -> std::io::Result<tokio::process::Command> {
        let mut args = vec!["runner".to_string(), format!("--id={id}"), format!("--token={token}")];
        args.extend([format!("--control-url={control_url}"), format!("--target-url={target_url}")]);
        args.push(format!("--log={}", self.runner_log(id).display()));
        args.extend(self.options.bug_args(crate::bugs::Home::Runner));
        args.extend(extra.iter().cloned());
        self.options.command(&args, &self.options.dir.join(format!("runner-{id}.log")))
    }

    pub fn runner_log(&self, id: &str) -> PathBuf {
        self.options.dir.join(format!("runner-{id}.jsonl"))
    }

    pub async fn submit(&self, id: &str, key: &str, spec: JobSpec) -> anyhow::Result<String> {
        let request =
            SubmitJob { project: PROJECT.to_string(), id: Some(id.to_string()), deployment_key: key.to_string(), spec };
        Ok(self.operator.submit(&request).await?.id)
    }

    /// Polls until `done` holds for the job, within `wait_max`; returns its last view.
    pub async fn wait_job(
        &self,
        id: &str,
        wait_max: Duration,
        done: impl Fn(&JobView) -> bool,
    ) -> anyhow::Result<JobView> {
        let deadline = tokio::time::Instant::now() + wait_max;
        loop {
            let view = self.operator.job(id).await?;
            if done(&view) {
                return Ok(view);
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!("job {id} did not reach the awaited state within {wait_max:?}; last: {view:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn shutdown(mut self) {
        self.stop_all().await;
    }

    /// Stops every runner, the control plane and the target (each SIGTERM, then SIGKILL).
    pub async fn stop_all(&mut self) {
        for runner in &mut self.runners {
            runner.stop(Duration::from_secs(2)).await;
        }
        self.control.stop(Duration::from_secs(2)).await;
        self.target.stop(Duration::from_secs(2)).await;
    }
}

pub fn is_terminal(view: &JobView) -> bool {
    matches!(view.state, JobState::Succeeded | JobState::Failed)
}

#[derive(Args)]
pub struct DemoArgs {
    /// How many jobs to push through.
    #[arg(long, default_value_t = 20)]
    jobs: u32,
    #[arg(long, default_value_t = 2)]
    runners: u32,
    /// Distinct deployment keys the jobs spread over.
    #[arg(long, default_value_t = 4)]
    keys: u32,
    #[arg(long, default_value_t = 3)]
    steps: u32,
    #[arg(long, default_value_t = 20)]
    step_ms: u64,
    #[arg(long, default_value_t = crate::control::Policy::default().lease_ms)]
    lease_ms: u64,
    /// Where the store and logs go (default: a new folder under the system's temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Give up after this long.
    #[arg(long, default_value_t = 120_000)]
    wait_ms: u64,
}

pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let dir =
        args.dir.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("fencelab-demo-{}", std::process::id())));
    let mut options = LabOptions::new(&std::env::current_exe()?, &dir);
    options.lease_ms = args.lease_ms;
    let mut lab = LocalLab::start(options).await?;
    for index in 1..=args.runners {
        lab.spawn_runner(&format!("r{index}"), &[]).await?;
    }
    let spec = JobSpec { steps: args.steps, step_ms: args.step_ms };
    for index in 1..=args.jobs {
        lab.submit(&format!("j{index}"), &format!("key-{}", index % args.keys.max(1)), spec.clone()).await?;
    }
    let mut views = Vec::new();
    for index in 1..=args.jobs {
        views.push(lab.wait_job(&format!("j{index}"), Duration::from_millis(args.wait_ms), is_terminal).await?);
    }
    println!("{:<6} {:<8} {:<10} {:>8}  attempts (fence, runner, state)", "job", "key", "state", "fences");
    for view in &views {
        let attempts: Vec<String> =
            view.attempts.iter().map(|a| format!("{}({}, {}, {:?})", a.id, a.fence, a.runner, a.state)).collect();
        println!(
            "{:<6} {:<8} {:<10} {:>8}  {}",
            view.id,
            view.deployment_key,
            format!("{:?}", view.state),
            view.attempts.len(),
            attempts.join(" ")
        );
    }
    let succeeded = views.iter().filter(|view| view.state == JobState::Succeeded).count();
    println!("{succeeded}/{} jobs succeeded; store and logs in {}", views.len(), dir.display());
    lab.shutdown().await;
    Ok(std::process::ExitCode::from(history::Exit::passed(succeeded == views.len()).code()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each process of the lab is given the planted bugs that live in it, and no other.
    #[test]
    fn every_process_gets_the_bugs_that_live_in_it() {
        let mut options = LabOptions::new(Path::new("fencelab-lab"), Path::new("/nowhere"));
        options.bugs = vec![Bug::AcceptStaleResult, Bug::TargetIgnoresFence, Bug::UnansweredHeartbeatRenews];
        let words = |home| options.bug_args(home).join(" ");
        assert_eq!(words(crate::bugs::Home::ControlPlane), "--bug accept-stale-result");
        assert_eq!(words(crate::bugs::Home::Target), "--bug target-ignores-fence");
        assert_eq!(words(crate::bugs::Home::Runner), "--bug unanswered-heartbeat-renews");
    }
}
