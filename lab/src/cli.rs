//! The `fencelab-lab` command: start a control plane, a target or a runner by hand, list
//! the planted bugs, or run the demo (a whole lab on loopback with jobs pushed through it).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use history::Exit;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::bugs::{Bug, Bugs, Home};
use crate::control::{http, Backend, PgOptions, Policy, Postgres, Rules, Sqlite};
use crate::runner::{Runner, RunnerConfig};
use crate::target::{Mode, Target};

#[derive(Parser)]
#[command(name = "fencelab-lab", version, about = "The lab: fencelab's system under test")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the control plane.
    ControlPlane(ControlPlaneArgs),
    /// Serve the deployment target.
    Target(TargetArgs),
    /// Run a runner.
    Runner(RunnerArgs),
    /// List the planted bugs, one a line: name, then the protection it removes.
    Bugs,
    /// Start a control plane, a target and runners, push jobs through them, print the outcome.
    Demo(crate::demo::DemoArgs),
    /// Send one attempt's steps to the target: an observed system's job runs this as its
    /// work, with the generation the system gives the job as the fence. Prints each step's
    /// record; exits 0 when every step was applied, 1 when one was refused, 2 when one got
    /// no answer.
    Step(StepArgs),
}

#[derive(Args)]
struct StepArgs {
    /// The target (through this runner's own proxy).
    #[arg(long, env = "FENCELAB_TARGET_URL")]
    target_url: String,
    /// The secret the target verifies capabilities with.
    #[arg(long, env = "FENCELAB_CAPABILITY_SECRET")]
    secret: String,
    #[arg(long)]
    deployment_key: String,
    #[arg(long)]
    job: String,
    /// The attempt's id (for Buildbot, `<job>-b<build id>`).
    #[arg(long)]
    attempt: String,
    /// The runner executing it (the system's own name for it).
    #[arg(long)]
    runner: String,
    /// The generation the system gave this attempt (a build id, a try number).
    #[arg(long)]
    fence: u64,
    #[arg(long)]
    steps: u32,
    #[arg(long, default_value_t = 0)]
    step_ms: u64,
    /// How long the signed capability lives: the system grants no lease to bound it.
    #[arg(long, default_value_t = 86_400_000)]
    capability_ttl_ms: u64,
}

#[derive(Args)]
struct ControlPlaneArgs {
    /// Address to listen on; port 0 picks a free port (printed as JSON on stdout).
    #[arg(long, default_value = "127.0.0.1:7400")]
    listen: SocketAddr,
    /// The SQLite file (created when absent). SQLite is the default store.
    #[arg(long, default_value = "fencelab-control.sqlite")]
    db: PathBuf,
    /// Use PostgreSQL at this URL instead of SQLite (e.g.
    /// `postgres://user@127.0.0.1:5432/db`); the tables live in `--schema`, created with it
    /// when absent.
    #[arg(long, conflicts_with = "db")]
    database_url: Option<String>,
    /// With `--database-url`: the schema holding the control plane's tables. A run that
    /// shares a server with others names a schema of its own.
    #[arg(long, requires = "database_url", default_value = crate::control::postgres::DEFAULT_SCHEMA)]
    schema: String,
    /// With `--database-url`: most database connections this control plane opens.
    #[arg(long, requires = "database_url", default_value_t = 8)]
    pool_size: usize,
    /// Bearer token of the operator (projects, runners, jobs, reconcile, reads).
    #[arg(long, env = "FENCELAB_OPERATOR_TOKEN")]
    operator_token: String,
    /// Secret shared with the target to sign capabilities.
    #[arg(long, env = "FENCELAB_CAPABILITY_SECRET")]
    secret: String,
    /// Lease length on the server's clock.
    #[arg(long, default_value_t = Policy::default().lease_ms)]
    lease_ms: u64,
    /// Life of a capability; it may outlive the lease (the target enforces the fence).
    #[arg(long, default_value_t = Policy::default().capability_ttl_ms)]
    capability_ttl_ms: u64,
    /// How often lapsed leases are marked uncertain.
    #[arg(long, default_value_t = 50)]
    sweep_ms: u64,
    /// Under `ack-before-commit`: how long an acknowledged result waits to commit.
    #[arg(long, default_value_t = 1_000)]
    ack_commit_delay_ms: u64,
    /// Switch on a planted bug (repeatable; see `fencelab-lab bugs`).
    #[arg(long = "bug")]
    bugs: Vec<Bug>,
}

#[derive(Args)]
struct TargetArgs {
    #[arg(long, default_value = "127.0.0.1:7500")]
    listen: SocketAddr,
    #[arg(long, env = "FENCELAB_CAPABILITY_SECRET")]
    secret: String,
    #[arg(long, default_value_t = Mode::Fenced)]
    mode: Mode,
    /// Append every step record to this JSONL file.
    #[arg(long)]
    step_log: Option<PathBuf>,
    #[arg(long = "bug")]
    bugs: Vec<Bug>,
}

#[derive(Args)]
struct RunnerArgs {
    #[arg(long)]
    id: String,
    /// The control plane; several replicas as a comma-separated list (the first is used
    /// until a request to it gets no answer, then the next, round robin).
    #[arg(long, default_value = "http://127.0.0.1:7400")]
    control_url: String,
    /// The deployment target; empty for none (each step is then a local wait of `step_ms`).
    #[arg(long, default_value = "http://127.0.0.1:7500")]
    target_url: String,
    /// This runner's bearer token.
    #[arg(long, env = "FENCELAB_RUNNER_TOKEN", required_unless_present = "registration_token")]
    token: Option<String>,
    /// Register with this project registration token instead of taking a token.
    #[arg(long, conflicts_with = "token")]
    registration_token: Option<String>,
    #[arg(long, default_value_t = 250)]
    heartbeat_interval_ms: u64,
    #[arg(long, default_value_t = 200)]
    renewal_margin_ms: u64,
    #[arg(long, default_value_t = 100)]
    poll_ms: u64,
    #[arg(long, default_value_t = 1_000)]
    request_timeout_ms: u64,
    #[arg(long, default_value_t = 5)]
    result_tries_max: u32,
    /// Added to this runner's clock in every observation time (clock skew without libfaketime).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    clock_offset_ms: i64,
    /// A file holding a further clock offset in ms, re-read at every observation.
    #[arg(long)]
    clock_offset_file: Option<PathBuf>,
    #[arg(long)]
    jobs_max: Option<u64>,
    /// JSONL log of every request and response.
    #[arg(long)]
    log: Option<PathBuf>,
    /// Switch on a planted bug of the runner (repeatable; see `fencelab-lab bugs`).
    #[arg(long = "bug")]
    bugs: Vec<Bug>,
}

/// The `fencelab-lab` program: its panic hook, then its command line.
pub fn main() -> ExitCode {
    install_panic_hook();
    main_from(std::env::args_os())
}

/// The exit code of `exit`, from the one table (`history::Exit`).
pub fn code(exit: Exit) -> ExitCode {
    ExitCode::from(exit.code())
}

/// Makes a panic print its message and location and exit 255 (an internal error), not
/// Rust's 101, which is no row of the exit table.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        eprintln!("fencelab-lab: internal error: {info}");
        std::process::exit(i32::from(Exit::Internal.code()));
    }));
}

/// Runs the command line given as `args` (the first is the program name).
pub fn main_from(args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() { code(Exit::BadArguments) } else { ExitCode::SUCCESS };
        }
    };
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime starts");
    match runtime.block_on(dispatch(cli.command)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("fencelab-lab: {error:#}");
            code(Exit::Internal)
        }
    }
}

async fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::ControlPlane(args) => control_plane(args).await,
        Command::Target(args) => target(args).await,
        Command::Runner(args) => runner(args).await,
        Command::Bugs => {
            print!("{}", crate::bugs::listing());
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo(args) => crate::demo::run(args).await,
        Command::Step(args) => step(args).await,
    }
}

async fn step(args: StepArgs) -> anyhow::Result<ExitCode> {
    let deployment = crate::stepper::Deployment {
        target_url: args.target_url,
        secret: args.secret,
        deployment_key: args.deployment_key,
        job: args.job,
        attempt: args.attempt,
        runner: args.runner,
        fence: args.fence,
        steps: args.steps,
        step_ms: args.step_ms,
        capability_ttl_ms: args.capability_ttl_ms,
    };
    if let Some(why) = deployment.invalid() {
        eprintln!("fencelab-lab step: {why}");
        return Ok(code(Exit::BadArguments));
    }
    let ended = deployment
        .send(|record| println!("{}", serde_json::to_string(record).expect("a step record serialises")))
        .await;
    match &ended {
        crate::stepper::Ended::Applied(records) => eprintln!("fencelab-lab step: {} steps applied", records.len()),
        crate::stepper::Ended::Refused(records) => {
            let reason = records.last().and_then(|record| record.reason).map_or("refused", |reason| reason.as_str());
            eprintln!("fencelab-lab step: the target refused step {} ({reason})", records.len() - 1);
        }
        crate::stepper::Ended::NoAnswer(_, why) => eprintln!("fencelab-lab step: no answer: {why}"),
    }
    Ok(code(ended.exit()))
}

fn bugs_for(home: Home, bugs: Vec<Bug>) -> anyhow::Result<Bugs> {
    if let Some(bug) = bugs.iter().find(|bug| bug.home() != home) {
        anyhow::bail!("the bug `{bug}` lives in another process");
    }
    Ok(Bugs::of(bugs))
}

/// Binds and announces the address on stdout as one JSON line, for whoever started us.
async fn bind(listen: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|error| anyhow::anyhow!("cannot listen on {listen}: {error}"))?;
    println!("{}", serde_json::json!({"listening": listener.local_addr()?.to_string()}));
    Ok(listener)
}

async fn control_plane(args: ControlPlaneArgs) -> anyhow::Result<ExitCode> {
    let bugs = bugs_for(Home::ControlPlane, args.bugs)?;
    if args.operator_token.is_empty() || args.secret.is_empty() {
        anyhow::bail!("--operator-token and --secret must not be empty");
    }
    let store: Backend = match &args.database_url {
        None => Sqlite::open(&args.db, &args.operator_token)?.with_process_clock().into(),
        Some(url) => {
            let mut options = PgOptions::new(url, &args.schema);
            options.pool_size = args.pool_size.max(1);
            let token = args.operator_token.clone();
            // The synchronous client runs its own small runtime: open it off the async threads.
            tokio::task::spawn_blocking(move || Postgres::open(&options, &token)).await??.into()
        }
    };
    let policy = Policy { lease_ms: args.lease_ms, capability_ttl_ms: args.capability_ttl_ms };
    let rules = Rules::new(store, policy, bugs, args.secret.as_bytes());
    let app = Arc::new(http::App { rules, ack_commit_delay: Duration::from_millis(args.ack_commit_delay_ms) });
    let stop = procs::installed_termination();
    let listener = bind(args.listen).await?;
    tokio::spawn(http::sweep(app.clone(), Duration::from_millis(args.sweep_ms.max(1))));
    crate::web::serve(listener, http::router(app), stop).await?;
    Ok(ExitCode::SUCCESS)
}

async fn target(args: TargetArgs) -> anyhow::Result<ExitCode> {
    let bugs = bugs_for(Home::Target, args.bugs)?;
    if args.secret.is_empty() {
        anyhow::bail!("--secret must not be empty");
    }
    let log_file = match &args.step_log {
        Some(path) => Some(std::fs::OpenOptions::new().create(true).append(true).open(path)?),
        None => None,
    };
    let target = Arc::new(Target::new(args.mode, bugs, args.secret.as_bytes(), log_file));
    let stop = procs::installed_termination();
    let listener = bind(args.listen).await?;
    crate::web::serve(listener, crate::target::router(target), stop).await?;
    Ok(ExitCode::SUCCESS)
}

async fn runner(args: RunnerArgs) -> anyhow::Result<ExitCode> {
    let bugs = bugs_for(Home::Runner, args.bugs)?;
    let token = match (args.token, &args.registration_token) {
        (Some(token), _) => token,
        (None, Some(registration)) => {
            let client = protocol::client::Client::new(
                args.control_url.split(',').next().unwrap_or_default(),
                Some(registration),
                Duration::from_millis(args.request_timeout_ms),
            );
            let request = protocol::RegisterRunner { project: None, id: args.id.clone() };
            client.register_runner(&request).await?.token
        }
        (None, None) => unreachable!("clap requires one of them"),
    };
    let config = RunnerConfig {
        id: args.id,
        control_url: args.control_url,
        target_url: args.target_url,
        token,
        heartbeat_interval_ms: args.heartbeat_interval_ms,
        renewal_margin_ms: args.renewal_margin_ms,
        poll_ms: args.poll_ms,
        request_timeout_ms: args.request_timeout_ms,
        result_tries_max: args.result_tries_max,
        clock_offset_ms: args.clock_offset_ms,
        clock_offset_file: args.clock_offset_file,
        jobs_max: args.jobs_max,
        log: args.log,
        bugs,
    };
    let stop = procs::installed_termination();
    let runner = Runner::new(config)?;
    tokio::select! {
        result = runner.run() => result?,
        _ = stop => {}
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Command {
        Cli::try_parse_from(std::iter::once("fencelab-lab").chain(args.iter().copied()))
            .expect("the command parses")
            .command
    }

    /// A planted bug of the runner is switched on in the runner process, and only there.
    #[test]
    fn a_runners_bug_is_taken_by_the_runner_alone() {
        let Command::Runner(runner) = parse(&["runner", "--id=r1", "--token=t", "--bug=wall-clock-deadline"]) else {
            panic!("not a runner")
        };
        assert_eq!(runner.bugs, [Bug::WallClockDeadline]);
        assert!(bugs_for(Home::Runner, runner.bugs.clone()).is_ok_and(|bugs| bugs.has(Bug::WallClockDeadline)));
        let error = bugs_for(Home::ControlPlane, runner.bugs).unwrap_err().to_string();
        assert!(error.contains("`wall-clock-deadline` lives in another process"), "{error}");
        assert!(bugs_for(Home::Runner, vec![Bug::AcceptStaleResult]).is_err());
    }

    /// The defaults `docs/protocol.md` lists under "Command lines" and the runner's flags.
    #[test]
    fn defaults_are_the_documented_ones() {
        let Command::ControlPlane(control) = parse(&["control-plane", "--operator-token=op", "--secret=s"]) else {
            panic!("not a control plane")
        };
        assert_eq!(control.listen.to_string(), "127.0.0.1:7400");
        assert_eq!(
            (control.db.to_str(), control.database_url, control.schema.as_str()),
            (Some("fencelab-control.sqlite"), None, "fencelab")
        );
        assert_eq!(
            (
                control.pool_size,
                control.lease_ms,
                control.capability_ttl_ms,
                control.sweep_ms,
                control.ack_commit_delay_ms
            ),
            (8, 2_000, 30_000, 50, 1_000)
        );
        assert!(control.bugs.is_empty());

        let Command::Target(target) = parse(&["target", "--secret=s"]) else { panic!("not a target") };
        assert_eq!(
            (target.listen.to_string(), target.mode, target.step_log),
            ("127.0.0.1:7500".into(), Mode::Fenced, None)
        );

        let Command::Runner(runner) = parse(&["runner", "--id=r1", "--token=t"]) else { panic!("not a runner") };
        assert_eq!(
            (runner.control_url.as_str(), runner.target_url.as_str()),
            ("http://127.0.0.1:7400", "http://127.0.0.1:7500")
        );
        assert_eq!(
            (runner.heartbeat_interval_ms, runner.renewal_margin_ms, runner.poll_ms, runner.request_timeout_ms),
            (250, 200, 100, 1_000)
        );
        assert_eq!((runner.result_tries_max, runner.clock_offset_ms, runner.jobs_max), (5, 0, None));
        assert_eq!((runner.clock_offset_file, runner.log, runner.registration_token), (None, None, None));
        assert!(runner.bugs.is_empty());
    }
}
