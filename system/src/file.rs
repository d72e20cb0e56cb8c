//! The system file (`fencelab.system/1`): how to start the control plane, the target and
//! the runners of a system under test, what it provides, and its named variants. Read and
//! checked whole before anything starts; every error names the file, the line and the role.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::Db;

/// The contract a system file declares.
pub const CONTRACT: &str = "fencelab.system/1";
/// Longest readiness bound a file may ask for (120 s); the default is 10 s.
pub const READY_MS_MAX: u64 = 120_000;
pub const READY_MS_DEFAULT: u64 = 10_000;

/// The three roles of a system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    ControlPlane,
    Target,
    Runner,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::ControlPlane, Role::Target, Role::Runner];

    pub fn name(self) -> &'static str {
        match self {
            Role::ControlPlane => "control_plane",
            Role::Target => "target",
            Role::Runner => "runner",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A part of the contract a system may leave out; what the harness then skips is in
/// `docs/system.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Feature {
    /// A deployment target (`POST /v1/steps`, `GET /v1/steps`) that runners mutate.
    Target,
    /// Capabilities (`POST /v1/capability`) that the target verifies.
    Capabilities,
    /// The ledger endpoint (`GET /v1/ledger`).
    Ledger,
    /// Operator reconcile (`POST /v1/reconcile`).
    Reconcile,
    /// The control plane restarts on the same store and address.
    Restart,
    /// A runner's clock can be moved (libfaketime, or its clock-offset file).
    RunnerClock,
    /// A control-plane replica's clock can be moved (libfaketime preloaded into its
    /// process) and the system means to stay correct when it is: its leases are judged on
    /// one authority's clock, such as its database's.
    ReplicaClock,
    /// The control plane reaches its database at `{database_url}`, which the harness can
    /// point at a proxy of its own (latency, cuts, a cut after COMMIT).
    DbLink,
    /// The target's clock can be moved (libfaketime preloaded into its process), and the
    /// target keeps stale steps off by their fence whatever its clock says.
    TargetClock,
    /// The runners write the contract's log and report over the contract's wire (claim,
    /// heartbeat, capability, result): what the nemesis replays, and what the rules on a
    /// runner's own acts and answers stand on. An observed system's runners do neither.
    RunnerLog,
    /// The control plane grants leases (`lease_expires_ms` on its claims): what the rules
    /// on expiry, heartbeats, clocks and owners at once stand on. A system whose ownership
    /// lasts as long as a connection has none.
    Lease,
}

impl Feature {
    pub const ALL: [Feature; 8] = [
        Feature::Target,
        Feature::Capabilities,
        Feature::Ledger,
        Feature::Reconcile,
        Feature::Restart,
        Feature::RunnerClock,
        Feature::RunnerLog,
        Feature::Lease,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Feature::Target => "target",
            Feature::Capabilities => "capabilities",
            Feature::Ledger => "ledger",
            Feature::Reconcile => "reconcile",
            Feature::Restart => "restart",
            Feature::RunnerClock => "runner-clock",
            Feature::ReplicaClock => "replica-clock",
            Feature::DbLink => "db-link",
            Feature::TargetClock => "target-clock",
            Feature::RunnerLog => "runner-log",
            Feature::Lease => "lease",
        }
    }
}

/// How the harness knows a server is ready.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ready {
    /// The first line on stdout is `{"listening": "HOST:PORT"}`; the address is taken from it.
    Listening,
    /// A TCP connection to `{port}` on 127.0.0.1 succeeds.
    Tcp,
    /// `GET http://127.0.0.1:{port}{ready_path}` answers 2xx.
    Http,
}

/// How a runner reaches the control plane.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunnerLink {
    /// The contract's HTTP API at the control plane's `{port}`: a runner gets `{control_url}`.
    #[default]
    Http,
    /// The system's own protocol over TCP, to the control plane's `{runner_port}`: a runner
    /// gets `{control_host}` and `{control_port}`, its own proxy's address. The control
    /// plane's `{port}` then serves only the operator's side (submit and reads).
    Tcp,
}

/// How a runner's clock is moved, in the order the file prefers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClockMethod {
    /// libfaketime preloaded (`LD_PRELOAD`), reading its offset from `{clock_file}` (`+1.5`).
    Libfaketime,
    /// The runner reads its offset in ms from `{clock_file}` itself (the command names the file).
    OffsetFile,
}

/// One role's process, or its container.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleSpec {
    /// Program and arguments; each word may hold placeholders (`{listen}`, …). With an
    /// `image`: the container's command (the image's entrypoint stays; may be empty).
    pub command: Spanned<Vec<String>>,
    /// A container image (`NAME[:TAG]`, present locally) to run the role from, through
    /// testcontainers on the host network; none: a process.
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Servers only: how readiness is judged (default `listening`).
    #[serde(default)]
    pub ready: Option<Ready>,
    /// With `ready = "http"`: the path probed (default `/v1/health`).
    #[serde(default)]
    pub ready_path: Option<String>,
    /// Servers only: longest wait for readiness, ms (default 10 000, at most 120 000).
    #[serde(default)]
    pub ready_ms: Option<u64>,
    /// The working directory (default: the system file's folder).
    #[serde(default)]
    pub cwd: Option<String>,
}

/// Extra arguments and environment a variant adds to a role.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RoleExtra {
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// A named variant of the system: a build or configuration with a known difference (for
/// instance a planted bug), and the verdict a suite expects of it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    #[serde(default)]
    pub description: String,
    /// The faults that expose it (as `--nemesis`), for `fencelab matrix`; default every fault.
    #[serde(default)]
    pub nemesis: Option<String>,
    /// The store the variant needs (`"postgres"`): a protection only that store's
    /// concurrency or clock can test. Runs on another store refuse it.
    #[serde(default)]
    pub db: Option<Db>,
    #[serde(default)]
    pub control_plane: RoleExtra,
    #[serde(default)]
    pub target: RoleExtra,
    #[serde(default)]
    pub runner: RoleExtra,
}

impl Variant {
    pub fn extra(&self, role: Role) -> &RoleExtra {
        match role {
            Role::ControlPlane => &self.control_plane,
            Role::Target => &self.target,
            Role::Runner => &self.runner,
        }
    }
}

/// What the system provides of the contract's optional parts; all by default.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provides {
    #[serde(default = "yes")]
    pub target: bool,
    #[serde(default = "yes")]
    pub capabilities: bool,
    #[serde(default = "yes")]
    pub ledger: bool,
    #[serde(default = "yes")]
    pub reconcile: bool,
    #[serde(default = "yes")]
    pub restart: bool,
    /// How runner clocks can be moved, preferred first; empty: they cannot.
    #[serde(default = "both_clocks")]
    pub runner_clock: Vec<ClockMethod>,
    /// See [`Feature::ReplicaClock`]; off unless said (also per store, `[db.*] provides`).
    #[serde(default)]
    pub replica_clock: bool,
    /// See [`Feature::DbLink`]; off unless said (also per store, `[db.*] provides`).
    #[serde(default)]
    pub db_link: bool,
    /// See [`Feature::TargetClock`]; off unless said.
    #[serde(default)]
    pub target_clock: bool,
    /// See [`Feature::RunnerLog`].
    #[serde(default = "yes")]
    pub runner_log: bool,
    /// See [`Feature::Lease`].
    #[serde(default = "yes")]
    pub lease: bool,
}

fn yes() -> bool {
    true
}

fn both_clocks() -> Vec<ClockMethod> {
    vec![ClockMethod::Libfaketime, ClockMethod::OffsetFile]
}

impl Default for Provides {
    fn default() -> Provides {
        Provides {
            target: true,
            capabilities: true,
            ledger: true,
            reconcile: true,
            restart: true,
            runner_clock: both_clocks(),
            replica_clock: false,
            db_link: false,
            target_clock: false,
            runner_log: true,
            lease: true,
        }
    }
}

impl Provides {
    pub fn has(&self, feature: Feature) -> bool {
        match feature {
            Feature::Target => self.target,
            Feature::Capabilities => self.capabilities,
            Feature::Ledger => self.ledger,
            Feature::Reconcile => self.reconcile,
            Feature::Restart => self.restart,
            Feature::RunnerClock => !self.runner_clock.is_empty(),
            Feature::ReplicaClock => self.replica_clock,
            Feature::DbLink => self.db_link,
            Feature::TargetClock => self.target_clock,
            Feature::RunnerLog => self.runner_log,
            Feature::Lease => self.lease,
        }
    }

    /// The optional parts of the contract every system is asked about that this one
    /// leaves out (the database's parts, [`Feature::ReplicaClock`] and
    /// [`Feature::DbLink`], and [`Feature::TargetClock`] matter only to the faults that
    /// need them).
    pub fn absent(&self) -> Vec<Feature> {
        Feature::ALL.into_iter().filter(|feature| !self.has(*feature)).collect()
    }
}

/// The file as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    contract: Spanned<String>,
    name: String,
    #[serde(default)]
    description: String,
    operator_token: String,
    #[serde(default = "default_project")]
    project: String,
    #[serde(default)]
    provides: Provides,
    #[serde(default)]
    runner_link: RunnerLink,
    control_plane: Option<RoleSpec>,
    target: Option<RoleSpec>,
    runner: Option<RoleSpec>,
    /// With `runner_clock = ["offset-file"]`: words added to the runner's command that name
    /// `{clock_file}` (e.g. `["--clock-offset-file={clock_file}"]`).
    #[serde(default)]
    runner_clock_args: Vec<String>,
    #[serde(default)]
    variants: BTreeMap<String, Variant>,
    /// The control plane's store, per `--db`: the words added to its command.
    #[serde(default)]
    db: BTreeMap<Db, DbSpec>,
}

/// What the control plane's command gets for one store.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DbSpec {
    #[serde(default)]
    pub control_plane_args: Vec<String>,
    /// Optional parts the system has on this store only (`["replica-clock", "db-link"]`).
    #[serde(default)]
    pub provides: Vec<Feature>,
}

fn default_project() -> String {
    "fencelab".to_string()
}

/// A checked system file.
#[derive(Clone, Debug)]
pub struct SystemFile {
    /// Where it was read from (`<built-in lab>` for the embedded one).
    pub path: PathBuf,
    /// Its text, kept so a run folder can hold a copy.
    pub text: String,
    pub name: String,
    pub description: String,
    pub operator_token: String,
    pub project: String,
    pub provides: Provides,
    /// How runners reach the control plane: its HTTP API (the contract) or its own TCP
    /// protocol (an observed system).
    pub runner_link: RunnerLink,
    pub roles: BTreeMap<Role, RoleSpec>,
    pub runner_clock_args: Vec<String>,
    pub variants: BTreeMap<String, Variant>,
    /// The stores it can run on (none listed: it manages its own, and only `--db sqlite`,
    /// the default, applies).
    pub db: BTreeMap<Db, DbSpec>,
}

/// A system file that cannot be used; the message names the file, the line and the role.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {message}", path.display(), line.map(|line| format!(":{line}")).unwrap_or_default())]
pub struct FileError {
    pub path: PathBuf,
    pub line: Option<usize>,
    pub message: String,
}

/// Every placeholder, and the roles whose words may hold it.
pub const PLACEHOLDERS: &[(&str, &[Role], &str)] = &[
    ("fencelab", &Role::ALL, "the path of the running `fencelab` binary"),
    ("system_dir", &Role::ALL, "the folder holding the system file"),
    ("data_dir", &Role::ALL, "the role's own folder in the run folder (kept across restarts)"),
    ("run_dir", &Role::ALL, "the run's folder of system files (`lab/` in the run folder)"),
    ("operator_token", &Role::ALL, "the file's `operator_token`"),
    ("project", &Role::ALL, "the file's `project`"),
    ("secret", &Role::ALL, "the capability secret shared by the control plane and the target, fresh per run"),
    ("lease_ms", &Role::ALL, "the lease length the run asks for (`--lease-ms`)"),
    ("host", &[Role::ControlPlane, Role::Target], "127.0.0.1"),
    ("port", &[Role::ControlPlane, Role::Target], "the port the server must listen on (the same after a restart)"),
    ("listen", &[Role::ControlPlane, Role::Target], "`{host}:{port}`"),
    ("replica", &[Role::ControlPlane], "which replica this is, 1 to `--control-planes`"),
    ("runners", &Role::ALL, "how many runners the run starts (their ids are `r1` to `rN`)"),
    (
        "runner_port",
        &[Role::ControlPlane],
        "with `runner_link = \"tcp\"`: the port the control plane's runner protocol listens on (the same after a restart)",
    ),
    ("database_url", &[Role::ControlPlane], "with `--db postgres`: the PostgreSQL URL (empty otherwise)"),
    ("schema", &[Role::ControlPlane], "with `--db postgres`: a schema of the run's own (empty otherwise)"),
    ("target_mode", &[Role::Target], "`fenced`, `idempotent` or `unfenced` (`--target-mode`)"),
    ("step_log", &[Role::Target], "the step log path, `{data_dir}/steps.jsonl`"),
    ("runner_id", &[Role::Runner], "the runner's id (`r1`, `r2`, …)"),
    ("runner_token", &[Role::Runner], "its bearer token, from `POST /v1/runners`"),
    ("control_url", &[Role::Runner], "the control plane's URL through this runner's own proxy (its own replica)"),
    (
        "control_urls",
        &[Role::Runner],
        "every replica's URL through this runner's proxies, comma-separated, its own first",
    ),
    ("target_url", &[Role::Runner], "the target's URL through this runner's own proxy"),
    ("control_host", &[Role::Runner], "with `runner_link = \"tcp\"`: the host of this runner's own proxy to the control plane"),
    ("control_port", &[Role::Runner], "with `runner_link = \"tcp\"`: the port of this runner's own proxy to the control plane"),
    ("runner_log", &[Role::Runner], "where the runner writes its log (`docs/history.md`)"),
    ("clock_file", &[Role::Runner], "the runner's clock-offset file"),
    ("heartbeat_interval_ms", &[Role::Runner], "how often to heartbeat"),
    ("renewal_margin_ms", &[Role::Runner], "how long before its lease's end the runner stops acting"),
    ("request_timeout_ms", &[Role::Runner], "how long a request may wait for its answer"),
    ("poll_ms", &[Role::Runner], "how often an idle runner claims"),
    ("result_tries_max", &[Role::Runner], "how many tries to deliver a result (8: they outlast a cut of 3 leases)"),
];

/// The embedded lab's system file.
pub const LAB: &str = include_str!("../../systems/lab.toml");

impl SystemFile {
    /// Reads and checks a system file.
    pub fn read(path: &Path) -> Result<SystemFile, FileError> {
        let text = std::fs::read_to_string(path).map_err(|error| FileError {
            path: path.to_path_buf(),
            line: None,
            message: format!("cannot read the system file: {error}"),
        })?;
        let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        SystemFile::parse(&absolute, &text)
    }

    /// The built-in lab.
    pub fn lab() -> SystemFile {
        SystemFile::parse(Path::new("<built-in lab>"), LAB).expect("systems/lab.toml is a valid system file")
    }

    /// Checks `text` as the system file at `path`.
    pub fn parse(path: &Path, text: &str) -> Result<SystemFile, FileError> {
        let error = |line: Option<usize>, message: String| FileError { path: path.to_path_buf(), line, message };
        let raw: Raw = toml::from_str(text).map_err(|problem| {
            let line = problem.span().map(|span| line_of(text, span.start));
            error(line, problem.message().to_string())
        })?;
        if raw.contract.get_ref() != CONTRACT {
            let line = Some(line_of(text, raw.contract.span().start));
            return Err(error(line, format!("contract `{}` is not `{CONTRACT}`", raw.contract.get_ref())));
        }
        if raw.operator_token.is_empty() {
            return Err(error(None, "`operator_token` must not be empty".into()));
        }
        let mut roles = BTreeMap::new();
        for (role, spec) in
            [(Role::ControlPlane, raw.control_plane), (Role::Target, raw.target), (Role::Runner, raw.runner)]
        {
            match spec {
                Some(spec) => {
                    roles.insert(role, spec);
                }
                None if role == Role::Target && !raw.provides.target => {}
                None => {
                    let why = if role == Role::Target { " (or `provides.target = false`)" } else { "" };
                    return Err(error(None, format!("role `{role}`: the `[{role}]` table is missing{why}")));
                }
            }
        }
        for (role, spec) in &roles {
            let line = Some(line_of(text, spec.command.span().start));
            let words = spec.command.get_ref();
            match &spec.image {
                None if words.is_empty() || words[0].is_empty() => {
                    return Err(error(line, format!("role `{role}`: `command` must name a program")));
                }
                Some(image) => {
                    if let Err(why) = crate::container::ImageName::parse(image) {
                        return Err(error(line, format!("role `{role}`: {why}")));
                    }
                    if spec.cwd.is_some() {
                        return Err(error(
                            line,
                            format!("role `{role}`: `cwd` is for processes; an image has its own"),
                        ));
                    }
                }
                None => {}
            }
            for word in words.iter().chain(spec.env.values()) {
                check_placeholders(word, *role).map_err(|message| error(line, format!("role `{role}`: {message}")))?;
            }
            if *role == Role::Runner && (spec.ready.is_some() || spec.ready_ms.is_some()) {
                return Err(error(
                    line,
                    "role `runner`: a runner is not a server; `ready` and `ready_ms` do not apply".into(),
                ));
            }
            if spec.ready_ms.is_some_and(|ms| ms == 0 || ms > READY_MS_MAX) {
                return Err(error(line, format!("role `{role}`: `ready_ms` must be 1..={READY_MS_MAX}")));
            }
            if spec.ready_path.as_ref().is_some_and(|path| !path.starts_with('/')) {
                return Err(error(line, format!("role `{role}`: `ready_path` must start with `/`")));
            }
        }
        for word in &raw.runner_clock_args {
            check_placeholders(word, Role::Runner)
                .map_err(|message| error(None, format!("role `runner` (`runner_clock_args`): {message}")))?;
        }
        if raw.provides.runner_clock.contains(&ClockMethod::OffsetFile)
            && !raw.runner_clock_args.iter().any(|word| word.contains("{clock_file}"))
        {
            return Err(error(
                None,
                "`provides.runner_clock` lists `offset-file` but `runner_clock_args` does not name `{clock_file}`"
                    .into(),
            ));
        }
        for (db, spec) in &raw.db {
            for word in &spec.control_plane_args {
                check_placeholders(word, Role::ControlPlane)
                    .map_err(|message| error(None, format!("`[db.{db}]`, role `control_plane`: {message}")))?;
            }
        }
        for (name, variant) in &raw.variants {
            if let Some(nemesis) = variant
                .nemesis
                .as_deref()
                .filter(|text| ![workloads::faults::EVERY_FAULT, workloads::faults::NO_FAULT].contains(&text.trim()))
            {
                workloads::faults::FaultKind::parse_list(nemesis)
                    .map_err(|why| error(None, format!("variant `{name}`: nemesis: {why}")))?;
            }
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
                return Err(error(None, format!("variant `{name}`: a name is letters, digits, `-`, `_` or `.`")));
            }
            for role in Role::ALL {
                let extra = variant.extra(role);
                if !roles.contains_key(&role) && *extra != RoleExtra::default() {
                    return Err(error(None, format!("variant `{name}`: role `{role}` is not in this system")));
                }
                for word in extra.args.iter().chain(extra.env.values()) {
                    check_placeholders(word, role)
                        .map_err(|message| error(None, format!("variant `{name}`, role `{role}`: {message}")))?;
                }
            }
        }
        Ok(SystemFile {
            path: path.to_path_buf(),
            text: text.to_string(),
            name: raw.name,
            description: raw.description,
            operator_token: raw.operator_token,
            project: raw.project,
            provides: raw.provides,
            runner_link: raw.runner_link,
            roles,
            runner_clock_args: raw.runner_clock_args,
            variants: raw.variants,
            db: raw.db,
        })
    }

    /// The folder holding the file (the current folder for the built-in lab).
    pub fn dir(&self) -> PathBuf {
        match self.path.parent() {
            Some(parent) if self.path.is_absolute() => parent.to_path_buf(),
            _ => std::env::current_dir().unwrap_or_default(),
        }
    }

    /// The line of `role`'s command, for messages about it.
    pub fn line_of_role(&self, role: Role) -> Option<usize> {
        self.roles.get(&role).map(|spec| line_of(&self.text, spec.command.span().start))
    }

    /// The image `role` runs from, if it runs as a container.
    pub fn image(&self, role: Role) -> Option<&str> {
        self.roles.get(&role).and_then(|spec| spec.image.as_deref())
    }

    /// Whether any role runs as a container.
    pub fn uses_containers(&self) -> bool {
        Role::ALL.into_iter().any(|role| self.image(role).is_some())
    }

    /// `file:line` naming a role's command, for messages.
    pub fn locate(&self, role: Role) -> String {
        match self.line_of_role(role) {
            Some(line) => format!("{}:{line}, role `{role}`", self.path.display()),
            None => format!("{}, role `{role}`", self.path.display()),
        }
    }

    /// The words the control plane's command gets for `db`; an error when the file does not
    /// declare that store.
    pub fn db_args(&self, db: Db) -> Result<&[String], FileError> {
        match self.db.get(&db) {
            Some(spec) => Ok(&spec.control_plane_args),
            None if self.db.is_empty() && db == Db::Sqlite => Ok(&[]),
            None => Err(FileError {
                path: self.path.clone(),
                line: None,
                message: format!("`--db {db}`: the system file has no `[db.{db}]` table"),
            }),
        }
    }

    /// The store a command uses: `given` (`--db`, a scenario's `db`) when given, else the
    /// one store the file declares when it declares exactly one `[db.*]` table, else SQLite
    /// (none: the system manages its own; several: the user picks). A given store the
    /// file lacks is [`SystemFile::db_args`]'s error, not this one's.
    pub fn store(&self, given: Option<Db>) -> Db {
        let mut declared = self.db.keys();
        match (given, declared.next(), declared.next()) {
            (Some(db), _, _) => db,
            (None, Some(only), None) => *only,
            (None, _, _) => Db::Sqlite,
        }
    }

    /// The store of `store`, for the system file at `system` (none: the built-in lab),
    /// read only when no store is given.
    pub fn store_of(system: Option<&Path>, given: Option<Db>) -> Result<Db, FileError> {
        match (given, system) {
            (Some(db), _) => Ok(db),
            (None, Some(path)) => Ok(SystemFile::read(path)?.store(None)),
            (None, None) => Ok(SystemFile::lab().store(None)),
        }
    }

    /// Checks that every named variant exists.
    /// Checks that no named variant needs another store than `db`.
    pub fn check_variants_db(&self, names: &[String], db: Db) -> Result<(), FileError> {
        for name in names {
            if let Some(needs) = self.variants.get(name).and_then(|variant| variant.db).filter(|needs| *needs != db) {
                return Err(FileError {
                    path: self.path.clone(),
                    line: None,
                    message: format!("variant `{name}` needs --db {needs} (this run's store is {db})"),
                });
            }
        }
        Ok(())
    }

    pub fn check_variants(&self, names: &[String]) -> Result<(), FileError> {
        for name in names {
            if !self.variants.contains_key(name) {
                let known: Vec<&str> = self.variants.keys().map(String::as_str).collect();
                return Err(FileError {
                    path: self.path.clone(),
                    line: None,
                    message: format!(
                        "no variant `{name}` (the file declares: {})",
                        if known.is_empty() { "none".to_string() } else { known.join(", ") }
                    ),
                });
            }
        }
        Ok(())
    }
}

/// The 1-based line of byte `offset` in `text`.
pub fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].bytes().filter(|byte| *byte == b'\n').count() + 1
}

/// Why a command word's placeholders cannot be read or filled in; each names the word.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlaceholderError {
    #[error("`{word}` has a `}}` with no `{{` (write `}}}}` for a brace)")]
    UnopenedBrace { word: String },
    #[error("`{word}` has a `{{` with no `}}` (write `{{{{` for a brace)")]
    UnclosedBrace { word: String },
    #[error("`{word}`: `{{{name}}}` has no value here")]
    NoValue { word: String, name: String },
}

/// The placeholder names in `word` (`{{` and `}}` are literal braces).
pub fn placeholders(word: &str) -> Result<Vec<&str>, PlaceholderError> {
    let mut names = Vec::new();
    let mut rest = word;
    while let Some(start) = rest.find(['{', '}']) {
        let after = &rest[start + 1..];
        if rest[start..].starts_with("{{") || rest[start..].starts_with("}}") {
            rest = &after[1..];
            continue;
        }
        if rest.as_bytes()[start] == b'}' {
            return Err(PlaceholderError::UnopenedBrace { word: word.to_string() });
        }
        let Some(end) = after.find('}') else {
            return Err(PlaceholderError::UnclosedBrace { word: word.to_string() });
        };
        names.push(&after[..end]);
        rest = &after[end + 1..];
    }
    Ok(names)
}

fn check_placeholders(word: &str, role: Role) -> Result<(), String> {
    for name in placeholders(word).map_err(|error| error.to_string())? {
        match PLACEHOLDERS.iter().find(|(known, _, _)| *known == name) {
            None => return Err(format!("`{word}`: no placeholder `{{{name}}}` (see docs/system.md)")),
            Some((_, roles, _)) if !roles.contains(&role) => {
                return Err(format!("`{word}`: `{{{name}}}` has no value for the `{role}` role"))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// `word` with every placeholder replaced by its value in `values`; `{{`/`}}` become braces.
pub fn expand(word: &str, values: &BTreeMap<&str, String>) -> Result<String, PlaceholderError> {
    let mut out = String::with_capacity(word.len());
    let mut rest = word;
    while let Some(start) = rest.find(['{', '}']) {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        if rest[start..].starts_with("{{") || rest[start..].starts_with("}}") {
            out.push(rest.as_bytes()[start] as char);
            rest = &after[1..];
            continue;
        }
        let end = after.find('}').ok_or_else(|| PlaceholderError::UnclosedBrace { word: word.to_string() })?;
        let name = &after[..end];
        let value = values
            .get(name)
            .ok_or_else(|| PlaceholderError::NoValue { word: word.to_string(), name: name.to_string() })?;
        out.push_str(value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SystemFile, FileError> {
        SystemFile::parse(Path::new("/x/system.toml"), text)
    }

    const MINIMAL: &str = r#"
contract = "fencelab.system/1"
name = "t"
operator_token = "op"
runner_clock_args = ["--clock={clock_file}"]

[control_plane]
command = ["cp", "--listen={listen}"]

[target]
command = ["tg", "--listen={listen}"]

[runner]
command = ["rn", "--id={runner_id}"]
"#;

    #[test]
    fn a_file_with_one_store_makes_it_the_default_and_a_given_store_wins() {
        let sqlite = "\n[db.sqlite]\ncontrol_plane_args = [\"--db=x\"]\n";
        let postgres = "\n[db.postgres]\ncontrol_plane_args = [\"--url={database_url}\"]\n";
        let files = [
            ("none", MINIMAL.to_string(), Db::Sqlite),
            ("only postgres", format!("{MINIMAL}{postgres}"), Db::Postgres),
            ("only sqlite", format!("{MINIMAL}{sqlite}"), Db::Sqlite),
            ("several", format!("{MINIMAL}{sqlite}{postgres}"), Db::Sqlite),
        ];
        for (tables, text, default) in files {
            let file = parse(&text).unwrap();
            assert_eq!(file.store(None), default, "{tables}, not given");
            for given in [Db::Sqlite, Db::Postgres] {
                assert_eq!(file.store(Some(given)), given, "{tables}, given {given}");
            }
        }
        let only_postgres = parse(&format!("{MINIMAL}{postgres}")).unwrap();
        let wrong = only_postgres.db_args(only_postgres.store(Some(Db::Sqlite))).unwrap_err().to_string();
        assert!(wrong.contains("`--db sqlite`: the system file has no `[db.sqlite]` table"), "{wrong}");
        assert_eq!(SystemFile::store_of(None, None).unwrap(), Db::Sqlite, "the lab declares both stores");
    }

    #[test]
    fn the_built_in_lab_is_a_valid_system_file() {
        let lab = SystemFile::lab();
        assert_eq!(lab.name, "lab");
        assert!(lab.provides.absent().is_empty());
        for bug in lab::bugs::Bug::ALL {
            let variant = &lab.variants[bug.name()];
            let role = match bug.home() {
                lab::bugs::Home::ControlPlane => Role::ControlPlane,
                lab::bugs::Home::Target => Role::Target,
                lab::bugs::Home::Runner => Role::Runner,
            };
            // The bug first; a variant may add the setting that widens its window.
            assert_eq!(variant.extra(role).args.first(), Some(&format!("--bug={}", bug.name())), "{bug}");
            assert_eq!(variant.description, bug.removes(), "{bug}");
            assert!(variant.nemesis.is_some(), "{bug}: the faults that expose it");
        }
        assert_eq!(lab.variants.len(), lab::bugs::Bug::ALL.len());
    }

    #[test]
    fn the_container_lab_is_the_lab_from_an_image() {
        let text = include_str!("../../systems/lab-containers.toml");
        let file = SystemFile::parse(Path::new("/x/lab-containers.toml"), text).unwrap();
        let lab = SystemFile::lab();
        for role in Role::ALL {
            assert_eq!(file.image(role), Some("fencelab-lab:local"), "{role}");
            let words = lab.roles[&role].command.get_ref();
            assert_eq!(
                file.roles[&role].command.get_ref()[..],
                words[1..],
                "{role}: the lab's words after `{{fencelab}}`"
            );
        }
        assert!(file.uses_containers() && !lab.uses_containers());
        assert_eq!(file.variants.keys().collect::<Vec<_>>(), lab.variants.keys().collect::<Vec<_>>());
    }

    #[test]
    fn an_image_role_is_checked() {
        let image = MINIMAL.replace("[target]\n", "[target]\nimage = \"tg:1\"\n");
        assert_eq!(parse(&image).unwrap().image(Role::Target), Some("tg:1"));
        let empty = image.replace("command = [\"tg\", \"--listen={listen}\"]", "command = []");
        assert!(parse(&empty).is_ok(), "an image may keep its own command");
        let bad = MINIMAL.replace("[target]\n", "[target]\nimage = \"tg:\"\n");
        let error = parse(&bad).unwrap_err();
        assert_eq!(error.line, Some(12));
        assert!(error.to_string().contains("role `target`"), "{error}");
        let cwd = image.replace("image = \"tg:1\"\n", "image = \"tg:1\"\ncwd = \"x\"\n");
        assert!(parse(&cwd).unwrap_err().to_string().contains("`cwd`"));
    }

    #[test]
    fn a_minimal_file_reads() {
        let file = parse(MINIMAL).unwrap();
        assert_eq!(file.project, "fencelab");
        assert_eq!(file.roles.len(), 3);
        assert_eq!(file.line_of_role(Role::Target), Some(11));
    }

    #[test]
    fn errors_name_the_line_and_the_role() {
        let unknown_key = MINIMAL.replace("[target]\n", "[target]\nreadyy = 3\n");
        let error = parse(&unknown_key).unwrap_err();
        assert_eq!(error.line, Some(11), "the line of its table: {error}");
        assert!(error.to_string().contains("readyy"), "{error}");

        let missing = MINIMAL.replace("[runner]\ncommand = [\"rn\", \"--id={runner_id}\"]\n", "");
        let error = parse(&missing).unwrap_err().to_string();
        assert!(error.contains("role `runner`") && error.contains("missing"), "{error}");

        let bad = MINIMAL.replace("--listen={listen}\"]\n\n[target]", "--listen={lisen}\"]\n\n[target]");
        let error = parse(&bad).unwrap_err();
        assert_eq!(error.line, Some(8));
        assert!(error.to_string().contains("role `control_plane`") && error.to_string().contains("{lisen}"), "{error}");

        let wrong_role = MINIMAL.replace("rn\", \"--id={runner_id}", "rn\", \"--port={port}");
        let error = parse(&wrong_role).unwrap_err().to_string();
        assert!(error.contains("role `runner`") && error.contains("no value for the `runner` role"), "{error}");

        let contract = MINIMAL.replace("fencelab.system/1", "fencelab.system/2");
        assert_eq!(parse(&contract).unwrap_err().line, Some(2));
    }

    #[test]
    fn a_system_may_leave_out_the_target_but_must_say_so() {
        let without = MINIMAL.replace("[target]\ncommand = [\"tg\", \"--listen={listen}\"]\n", "");
        assert!(parse(&without).is_err());
        let said = format!("{without}\n[provides]\ntarget = false\n");
        assert_eq!(parse(&said).unwrap().provides.absent(), vec![Feature::Target]);
    }

    #[test]
    fn placeholders_expand_and_braces_escape() {
        let values = BTreeMap::from([("port", "7".to_string())]);
        assert_eq!(expand("--p={port} {{x}}", &values).unwrap(), "--p=7 {x}");
        assert_eq!(placeholders("a{{b}}{port}").unwrap(), vec!["port"]);
        assert_eq!(placeholders("a{port"), Err(PlaceholderError::UnclosedBrace { word: "a{port".into() }));
        assert_eq!(placeholders("a}b"), Err(PlaceholderError::UnopenedBrace { word: "a}b".into() }));
        let no_value = PlaceholderError::NoValue { word: "{nope}".into(), name: "nope".into() };
        assert_eq!(expand("{nope}", &values), Err(no_value.clone()));
        assert_eq!(no_value.to_string(), "`{nope}`: `{nope}` has no value here");
        assert_eq!(
            expand("a{port", &values).unwrap_err().to_string(),
            "`a{port` has a `{` with no `}` (write `{{` for a brace)"
        );
    }

    #[test]
    fn variants_are_checked() {
        let text = format!("{MINIMAL}\n[variants.buggy]\ncontrol_plane = {{ args = [\"--bug=x\"] }}\n");
        let file = parse(&text).unwrap();
        assert!(file.check_variants(&["buggy".into()]).is_ok());
        let error = file.check_variants(&["bugy".into()]).unwrap_err().to_string();
        assert!(error.contains("no variant `bugy`") && error.contains("buggy"), "{error}");
        let bad = format!("{MINIMAL}\n[variants.buggy]\ncontrol_plane = {{ args = [\"--x={{runner_id}}\"] }}\n");
        assert!(parse(&bad).unwrap_err().to_string().contains("variant `buggy`"));
    }
}
