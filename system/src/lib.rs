//! The system under test, as its system file describes it (`docs/system.md`): the lab
//! (`systems/lab.toml`, the default) or any implementation of the contract.

pub mod collect;
pub mod container;
pub mod file;
pub mod image;
pub mod launch;
pub mod packets;

use std::path::PathBuf;
use std::time::Duration;

use protocol::client::Client;
use protocol::RegisterRunner;

pub use file::{Feature, Role, RunnerLink, SystemFile};
pub use launch::{
    libfaketime, start_database, ClockControl, Launch, Proc, Server, StartError, SystemChoice, Timings,
    LIBFAKETIME_PATHS,
};

/// The control plane's database.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Db {
    #[default]
    Sqlite,
    Postgres,
}

impl Db {
    pub fn name(self) -> &'static str {
        match self {
            Db::Sqlite => "sqlite",
            Db::Postgres => "postgres",
        }
    }
}

impl std::fmt::Display for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Db {
    type Err = String;

    /// A store by its name, in any case.
    fn from_str(word: &str) -> Result<Db, String> {
        [Db::Sqlite, Db::Postgres]
            .into_iter()
            .find(|db| db.name().eq_ignore_ascii_case(word))
            .ok_or_else(|| format!("`{word}` is not a store: `sqlite` or `postgres`"))
    }
}

/// The optional part of the contract a fault needs, if any.
pub fn fault_needs(kind: workloads::faults::FaultKind) -> Option<Feature> {
    use workloads::faults::FaultKind;
    match kind {
        FaultKind::ClockSkew => Some(Feature::RunnerClock),
        FaultKind::DisconnectDuringMutation => Some(Feature::Target),
        FaultKind::RestartControlPlane => Some(Feature::Restart),
        FaultKind::DelayedHeartbeats
        | FaultKind::DuplicateResults
        | FaultKind::ConflictingResults
        | FaultKind::Reconnects
        | FaultKind::Kill
        | FaultKind::KillReplica
        | FaultKind::HalfOpen
        | FaultKind::Partition => None,
        FaultKind::ReplicaClockSkew => Some(Feature::ReplicaClock),
        FaultKind::DbLink => Some(Feature::DbLink),
        FaultKind::TargetClockSkew => Some(Feature::TargetClock),
    }
}

/// The optional part of the contract a variant of a fault needs beyond its kind's, if any:
/// the variants that send reports on the contract's wire, or read the runner's log to find
/// the step to hold, need the runners to keep the contract.
pub fn variant_needs(variant: &workloads::faults::Variant) -> Option<Feature> {
    use workloads::faults::Variant;
    match variant {
        Variant::Replay
        | Variant::Conflict
        | Variant::CrossJob
        | Variant::Impersonate
        | Variant::BorrowedClaim
        | Variant::DelayedStep { .. }
        | Variant::LateStep { .. }
        | Variant::TargetLinkMidStep
        | Variant::BackwardJump { .. }
        // The target's skew exists for the delayed step dealt after it.
        | Variant::TargetSkew { .. } => Some(Feature::RunnerLog),
        _ => None,
    }
}

/// A fault the run asked for that the system cannot take.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotRun {
    pub fault: workloads::faults::FaultKind,
    /// One variant of the fault (by name) when only it is not run; none: the whole fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// The part of the contract it needs and the system lacks, or what it needs of this
    /// host or of the run's fault proxy.
    pub needs: Need,
    /// Why it cannot be run here: the system does not provide the part, or it does and this
    /// host cannot act on it (no libfaketime, a process in a container, another store).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub why: String,
}

/// What a fault not run needs: a part of the system (its file says whether it has it), or
/// something of this host or of the run's fault proxy. Written as the part's or the need's
/// name (`runner-clock`, `packet-filter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum Need {
    Part(Feature),
    Host(HostNeed),
}

/// What a fault needs of the host or of the run's fault proxy, whatever the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostNeed {
    /// iptables, run as root, to drop packets on loopback (`packets`).
    PacketFilter,
    /// fencelab's embedded fault proxy, whose own toxics a real Toxiproxy lacks.
    FencelabProxy,
}

impl Need {
    pub fn name(self) -> &'static str {
        match self {
            Need::Part(feature) => feature.name(),
            Need::Host(HostNeed::PacketFilter) => "packet-filter",
            Need::Host(HostNeed::FencelabProxy) => "fencelab-proxy",
        }
    }
}

impl From<Feature> for Need {
    fn from(feature: Feature) -> Need {
        Need::Part(feature)
    }
}

/// What a fault needs of the host or of the fault proxy, if anything.
pub fn host_needs(kind: workloads::faults::FaultKind) -> Option<HostNeed> {
    use workloads::faults::FaultKind;
    match kind {
        FaultKind::HalfOpen => Some(HostNeed::FencelabProxy),
        FaultKind::Partition => Some(HostNeed::PacketFilter),
        _ => None,
    }
}

/// The faults of `kinds` this host or the run's fault proxy cannot do, whatever the system:
/// dropping packets needs iptables as root ([`packets::unavailable`]); a one-sided reset
/// needs fencelab's embedded proxy (`embedded_proxy`: no `--toxiproxy-url` or
/// `--toxiproxy-image`).
pub fn host_faults_not_run(kinds: &[workloads::faults::FaultKind], embedded_proxy: bool) -> Vec<NotRun> {
    let why_not = |need: HostNeed| match need {
        HostNeed::PacketFilter => packets::unavailable(),
        HostNeed::FencelabProxy => (!embedded_proxy).then(|| {
            "a one-sided reset is a toxic of fencelab's embedded proxy (`reset_upstream`, `reset_downstream`), \
             which a real Toxiproxy (--toxiproxy-url, --toxiproxy-image) lacks"
                .to_string()
        }),
    };
    let lacking = kinds.iter().filter_map(|kind| Some((*kind, host_needs(*kind)?)));
    lacking
        .filter_map(|(fault, need)| {
            let why = why_not(need)?;
            Some(NotRun { fault, variant: None, needs: Need::Host(need), why })
        })
        .collect()
}

/// What `config.json` says of the system a run attacked.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SystemInfo {
    pub name: String,
    /// The system file; none for the built-in lab.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    #[serde(default)]
    pub variants: Vec<String>,
    /// The optional parts it lacks (`docs/system.md`).
    #[serde(default)]
    pub absent: Vec<Feature>,
    /// Faults asked for and not run, each with the part it needs.
    #[serde(default)]
    pub faults_not_run: Vec<NotRun>,
    /// Why a clock method the file prefers was not used (an image that cannot preload
    /// libfaketime), if one was passed over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_passed_over: Option<String>,
}

impl SystemFile {
    /// The system file a run names (the built-in lab when none).
    pub fn of_choice(system: Option<&std::path::Path>) -> Result<SystemFile, StartError> {
        match system {
            Some(path) => SystemFile::read(path).map_err(|error| StartError::Named(error.to_string())),
            None => Ok(SystemFile::lab()),
        }
    }

    /// How runner clocks are moved: the file's first method this host can do.
    pub fn clock_control(&self) -> ClockControl {
        for method in &self.provides.runner_clock {
            match method {
                file::ClockMethod::Libfaketime => {
                    if let Some(library) = crate::launch::libfaketime() {
                        if self.image(Role::Runner).is_some() {
                            let mounted_at = container::FAKETIME_MOUNT.to_string();
                            return ClockControl::LibfaketimeMounted { library, mounted_at };
                        }
                        return ClockControl::Libfaketime { library };
                    }
                }
                file::ClockMethod::OffsetFile => return ClockControl::RunnerOffset,
            }
        }
        ClockControl::Fixed
    }

    /// For a runner's container with libfaketime: checks that its image can preload it;
    /// when it cannot, the file's next method (and why, for `config.json`), or a refusal
    /// when the run asks for clock skew and no other method is left.
    pub async fn check_clock(
        &self,
        clock: ClockControl,
        kinds: &[workloads::faults::FaultKind],
    ) -> Result<(ClockControl, Option<String>), StartError> {
        let ClockControl::LibfaketimeMounted { .. } = clock else { return Ok((clock, None)) };
        let image = self.image(Role::Runner).unwrap_or_default();
        let Err(why) = container::can_preload(image).await else { return Ok((clock, None)) };
        if self.provides.runner_clock.contains(&file::ClockMethod::OffsetFile) {
            return Ok((ClockControl::RunnerOffset, Some(format!("libfaketime: {why}; the offset file is used"))));
        }
        if kinds.contains(&workloads::faults::FaultKind::ClockSkew) {
            return Err(StartError::Named(format!(
                "{}: clock-skew needs libfaketime and {why}; list `offset-file` in `provides.runner_clock` \
                 or leave clock-skew out of --nemesis",
                self.locate(Role::Runner)
            )));
        }
        Ok((ClockControl::Fixed, Some(format!("libfaketime: {why}"))))
    }

    /// Whether the system has `feature` on store `db` (said in `[provides]`, or in the
    /// store's `[db.*] provides`), and the harness can act on it here: a replica's clock
    /// is moved with libfaketime, preloaded into a process (not a container).
    pub fn has_on(&self, feature: Feature, db: crate::Db) -> bool {
        let said = self.provides.has(feature) || self.db.get(&db).is_some_and(|spec| spec.provides.contains(&feature));
        match feature {
            Feature::ReplicaClock => {
                said && crate::launch::libfaketime().is_some() && self.image(Role::ControlPlane).is_none()
            }
            Feature::DbLink => said && db == crate::Db::Postgres,
            Feature::TargetClock => {
                said && crate::launch::libfaketime().is_some() && self.image(Role::Target).is_none()
            }
            _ => said,
        }
    }

    /// The faults of `kinds` this system cannot take on store `db` (and `clock` cannot do
    /// clock skew): a whole fault, or those of its variants that need what the system lacks
    /// (a fault none of whose variants can run is not run whole).
    pub fn faults_not_run(
        &self,
        kinds: &[workloads::faults::FaultKind],
        clock: &ClockControl,
        db: crate::Db,
    ) -> Vec<NotRun> {
        let lacking = |needs: Feature| {
            !self.has_on(needs, db) || (needs == Feature::RunnerClock && *clock == ClockControl::Fixed)
        };
        let mut not_run = Vec::new();
        for kind in kinds {
            if let Some(needs) = fault_needs(*kind).filter(|needs| lacking(*needs)) {
                not_run.push(NotRun { fault: *kind, variant: None, needs: needs.into(), why: self.why_not(needs, db) });
                continue;
            }
            let variants: Vec<(&workloads::faults::Variant, Feature)> = kind
                .variants()
                .iter()
                .filter_map(|variant| {
                    variant_needs(variant).filter(|needs| lacking(*needs)).map(|needs| (variant, needs))
                })
                .collect();
            match variants.first() {
                Some((_, needs)) if variants.len() == kind.variants().len() => {
                    not_run.push(NotRun {
                        fault: *kind,
                        variant: None,
                        needs: (*needs).into(),
                        why: self.why_not(*needs, db),
                    });
                }
                _ => not_run.extend(variants.into_iter().map(|(variant, needs)| NotRun {
                    fault: *kind,
                    variant: Some(variant.name().to_string()),
                    needs: needs.into(),
                    why: self.why_not(needs, db),
                })),
            }
        }
        not_run
    }

    /// Why a fault needing `feature` cannot be run here.
    fn why_not(&self, feature: Feature, db: crate::Db) -> String {
        let said = self.provides.has(feature) || self.db.get(&db).is_some_and(|spec| spec.provides.contains(&feature));
        if !said {
            let elsewhere = self.db.iter().find(|(_, spec)| spec.provides.contains(&feature));
            return match elsewhere {
                Some((store, _)) => format!("`{}` needs --db {}", feature.name(), store.name()),
                None => format!("the system lacks `{}`", feature.name()),
            };
        }
        let clock_of = |role: Role| {
            if crate::launch::libfaketime().is_none() {
                format!("`{}` moves a clock with libfaketime, which is not installed here", feature.name())
            } else if self.image(role).is_some() {
                format!(
                    "the {} runs in a container, and `{}` moves the clock of a process only",
                    role.name(),
                    feature.name()
                )
            } else {
                format!("`{}` cannot be acted on here", feature.name())
            }
        };
        match feature {
            Feature::ReplicaClock => clock_of(Role::ControlPlane),
            Feature::TargetClock => clock_of(Role::Target),
            Feature::DbLink => format!("`{}` needs --db postgres", feature.name()),
            Feature::RunnerLog => {
                "the system's runners keep no fencelab log and send no contract reports (an observed system): \
                 nothing to replay, and no step to find in flight"
                    .to_string()
            }
            Feature::RunnerClock => {
                "the runners' clocks cannot be moved here: libfaketime is not installed or cannot be preloaded, \
                 and the system file lists no `offset-file` in `provides.runner_clock`"
                    .to_string()
            }
            _ => format!("`{}` cannot be acted on here", feature.name()),
        }
    }
}

/// A running system: its control plane, its target (when it has one), and the operator's
/// client.
pub struct RunningSystem {
    pub launch: Launch,
    /// The control plane's replicas (one unless `--control-planes`), on one store; `None`
    /// while a replica is down (killed by a fault).
    pub replicas: Vec<Option<Server>>,
    /// Each replica's port, kept across restarts.
    pub ports: Vec<u16>,
    pub target: Option<Server>,
    /// The operator's client, pointed at a live replica.
    pub operator: Client,
}

/// How long a request of the harness's own to a system may wait during start (5 s).
const START_REQUEST_MAX: Duration = Duration::from_secs(5);

impl RunningSystem {
    /// Starts the target and the control plane (side by side) and creates the project.
    pub async fn start(mut launch: Launch) -> Result<RunningSystem, StartError> {
        if launch.file.runner_link == RunnerLink::Tcp && launch.runner_ports.is_empty() {
            let free = |_| launch::free_port().map_err(|error| StartError::Failed(error.to_string()));
            launch.runner_ports = (0..launch.replicas.max(1)).map(free).collect::<Result<_, _>>()?;
        }
        launch.file.check_variants(&launch.variants).map_err(|error| StartError::Named(error.to_string()))?;
        std::fs::create_dir_all(&launch.dir)
            .map_err(|error| StartError::Failed(format!("{}: {error}", launch.dir.display())))?;
        let has_target = launch.file.roles.contains_key(&Role::Target);
        let target = async {
            if has_target {
                launch.start_server(Role::Target, 0, 0).await.map(Some)
            } else {
                Ok(None)
            }
        };
        // The first replica alone creates the store; the others join it.
        let (first, target) = tokio::join!(launch.start_server(Role::ControlPlane, 0, 0), target);
        let (first, target) = (first?, target?);
        let mut replicas = vec![first];
        for replica in 1..launch.replicas.max(1) {
            replicas.push(launch.start_server(Role::ControlPlane, replica, 0).await?);
        }
        let ports = replicas.iter().map(|server| server.addr.port()).collect();
        let control = &replicas[0];
        let operator = Client::new(&control.url(), Some(&launch.file.operator_token), START_REQUEST_MAX);
        operator.create_project(&launch.file.project).await.map_err(|error| {
            StartError::Failed(format!(
                "{}: the control plane did not create project `{}` for the operator token: {error}",
                launch.file.locate(Role::ControlPlane),
                launch.file.project
            ))
        })?;
        let replicas = replicas.into_iter().map(Some).collect();
        Ok(RunningSystem { launch, replicas, ports, target, operator })
    }

    /// The address of replica `replica` (up or down: its port does not change).
    pub fn replica_addr(&self, replica: usize) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.ports[replica]))
    }

    /// Where runners reach replica `replica`: its runner protocol's port for a system whose
    /// runners speak their own protocol over TCP, else its HTTP API.
    pub fn runner_addr(&self, replica: usize) -> std::net::SocketAddr {
        match self.launch.runner_ports.get(replica) {
            Some(port) => std::net::SocketAddr::from(([127, 0, 0, 1], *port)),
            None => self.replica_addr(replica),
        }
    }

    /// The URL of the first replica that is up.
    pub fn control_url(&self) -> String {
        let live = self.replicas.iter().flatten().next().map(|server| server.addr);
        format!("http://{}", live.unwrap_or_else(|| self.replica_addr(0)))
    }

    /// SIGKILLs replica `replica`; the operator moves to a replica that is up.
    pub async fn kill_replica(&mut self, replica: usize) {
        if let Some(mut server) = self.replicas[replica].take() {
            server.proc.kill().await;
        }
        self.operator = self.operator.at(&self.control_url());
    }

    /// Starts replica `replica` again (if it is down), on its port and the same store.
    pub async fn start_replica(&mut self, replica: usize) -> Result<(), StartError> {
        if self.replicas[replica].is_none() {
            let server = self.launch.start_server(Role::ControlPlane, replica, self.ports[replica]).await?;
            self.replicas[replica] = Some(server);
        }
        Ok(())
    }

    /// The target's URL; a system without a target has none.
    pub fn target_url(&self) -> Option<String> {
        self.target.as_ref().map(Server::url)
    }

    /// SIGKILLs every replica of the control plane and starts each again with the same
    /// command, store and port.
    pub async fn restart_control(&mut self) -> Result<(), StartError> {
        for replica in 0..self.replicas.len() {
            self.kill_replica(replica).await;
        }
        for replica in 0..self.replicas.len() {
            self.start_replica(replica).await?;
        }
        self.operator = self.operator.at(&self.control_url());
        Ok(())
    }

    /// Registers runner `id` in the project and returns its token.
    pub async fn register_token(&self, id: &str) -> anyhow::Result<String> {
        let request = RegisterRunner { project: Some(self.launch.file.project.clone()), id: id.to_string() };
        Ok(self.operator.register_runner(&request).await?.token)
    }

    /// Where runner `id` writes its log.
    pub fn runner_log(&self, id: &str) -> PathBuf {
        self.launch.dir.join(format!("runner-{id}.jsonl"))
    }

    /// Stops the control plane and the target (SIGTERM, then SIGKILL of the group).
    pub async fn stop(&mut self) {
        for server in self.replicas.iter_mut().flatten() {
            server.proc.stop(Duration::from_secs(2)).await;
        }
        if let Some(target) = self.target.as_mut() {
            target.proc.stop(Duration::from_secs(2)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use workloads::faults::FaultKind;

    #[test]
    fn a_fault_not_run_says_whether_the_system_or_this_host_lacks_what_it_needs() {
        let text = include_str!("../../systems/lab-containers.toml");
        let plain = SystemFile::parse(std::path::Path::new("/x/lab-containers.toml"), text).unwrap();
        let declared = text.replacen("[provides]\n", "[provides]\ntarget_clock = true\n", 1);
        let declared = SystemFile::parse(std::path::Path::new("/x/lab-containers.toml"), &declared).unwrap();
        let skew = [FaultKind::TargetClockSkew];
        let sqlite = crate::Db::Sqlite;
        let [lacking] = &plain.faults_not_run(&skew, &ClockControl::Fixed, sqlite)[..] else { panic!("one not run") };
        assert_eq!(lacking.why, "the system lacks `target-clock`");
        let [here] = &declared.faults_not_run(&skew, &ClockControl::Fixed, sqlite)[..] else { panic!("one not run") };
        let host = if crate::launch::libfaketime().is_some() { "runs in a container" } else { "not installed here" };
        assert!(here.why.contains(host), "{}", here.why);
        let db = [FaultKind::DbLink];
        let [cut] = &SystemFile::lab().faults_not_run(&db, &ClockControl::Fixed, sqlite)[..] else { panic!("one") };
        assert_eq!(cut.why, "`db-link` needs --db postgres");
    }

    #[test]
    fn a_one_sided_reset_needs_fencelabs_proxy_and_a_partition_a_packet_filter() {
        let kinds = [FaultKind::HalfOpen, FaultKind::Partition, FaultKind::Kill];
        let with_toxiproxy = host_faults_not_run(&kinds, false);
        let half_open = with_toxiproxy.iter().find(|not| not.fault == FaultKind::HalfOpen).expect("not run");
        assert_eq!(half_open.needs, Need::Host(HostNeed::FencelabProxy));
        assert!(half_open.why.contains("real Toxiproxy"), "{}", half_open.why);
        let embedded = host_faults_not_run(&kinds, true);
        assert!(embedded.iter().all(|not| not.fault == FaultKind::Partition), "{embedded:?}");
        let partition = embedded.iter().find(|not| not.fault == FaultKind::Partition);
        let why = partition.map(|not| not.why.clone());
        assert_eq!(why, packets::unavailable(), "not run exactly when the host cannot");
        let written = serde_json::to_value(half_open).unwrap();
        assert_eq!(written["needs"], "fencelab-proxy");
        assert_eq!(serde_json::from_value::<NotRun>(written).unwrap(), *half_open, "read back through the same type");
        let part: Need = serde_json::from_value(serde_json::json!("runner-clock")).unwrap();
        assert_eq!(part, Need::Part(Feature::RunnerClock));
    }
}
