//! A throwaway PostgreSQL cluster on a free loopback port, for tests, benchmarks and (later)
//! `fencelab run --db postgres`: `initdb` into a folder of its own, `pg_ctl start`, and at
//! the end `pg_ctl stop` and the folder removed.
//!
//! Clusters live in folders named after the process that started them (pid and start time).
//! A start first removes the folders whose process is gone — a test or harness killed with
//! SIGKILL leaves its cluster running — stopping their server, and says so on stderr.
//! `initdb` refuses to run as root, so as root every server command runs as the `postgres`
//! user (`runuser -u postgres --`), which owns the cluster's folder.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{bail, Context};

/// The server binaries' folder: `$FENCELAB_PG_BIN`, else the newest
/// `/usr/lib/postgresql/N/bin` (Debian), else the `PATH` entry holding `pg_ctl`.
pub fn bin_dir() -> Option<PathBuf> {
    let complete = |dir: &Path| ["initdb", "pg_ctl", "postgres"].iter().all(|name| dir.join(name).is_file());
    if let Some(dir) = std::env::var_os("FENCELAB_PG_BIN") {
        return Some(PathBuf::from(dir)).filter(|dir| complete(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| Some((entry.file_name().to_str()?.parse().ok()?, entry.path().join("bin"))))
        .filter(|(_, dir)| complete(dir))
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
        return Some(dir);
    }
    std::env::split_paths(&std::env::var_os("PATH")?).find(|dir| complete(dir))
}

/// Why no cluster can be started here, if none can (for tests that skip).
pub fn unavailable() -> Option<String> {
    if bin_dir().is_none() {
        return Some("PostgreSQL's server binaries (initdb, pg_ctl, postgres) are not installed".into());
    }
    if running_as_root() && postgres_user().is_none() {
        return Some("running as root and there is no `postgres` user to run the server".into());
    }
    None
}

/// The folder clusters go in when the caller names none.
pub fn default_parent() -> PathBuf {
    std::env::temp_dir().join("fencelab-pg")
}

fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The `postgres` user's uid and gid.
fn postgres_user() -> Option<(u32, u32)> {
    let name = std::ffi::CString::new("postgres").ok()?;
    // SAFETY: getpwnam reads a static entry; we copy the two numbers out at once.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    if entry.is_null() {
        return None;
    }
    // SAFETY: non-null, points at the entry getpwnam returned.
    Some(unsafe { ((*entry).pw_uid, (*entry).pw_gid) })
}

/// A process's start time (clock ticks after boot), which tells a reused pid apart.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

static CLUSTERS: AtomicU32 = AtomicU32::new(0);

/// Most tries at a free port (another process may take the one we picked).
const PORT_TRIES_MAX: u32 = 5;
/// `pg_ctl`'s wait for the server to start or stop, in seconds.
const PG_CTL_WAIT_S: u32 = 60;

pub struct TempCluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    running: bool,
}

impl TempCluster {
    /// Starts a cluster under [`default_parent`].
    pub fn start() -> anyhow::Result<TempCluster> {
        TempCluster::start_in(&default_parent())
    }

    /// Starts a cluster in a new folder under `parent` (after cleaning stale ones there).
    pub fn start_in(parent: &Path) -> anyhow::Result<TempCluster> {
        if let Some(why) = unavailable() {
            bail!("{why}");
        }
        let bin = bin_dir().expect("checked by unavailable");
        create_parent(parent)?;
        for (dir, owner) in clean_stale(parent) {
            eprintln!("fencelab: removed a PostgreSQL cluster left by process {owner} that is gone: {}", dir.display());
        }
        let pid = std::process::id();
        let name =
            format!("cluster-{pid}-{}-{}", start_time(pid).unwrap_or(0), CLUSTERS.fetch_add(1, Ordering::Relaxed));
        let dir = parent.join(name);
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut cluster = TempCluster { dir, bin, port: 0, running: false };
        cluster.init()?;
        let mut last = String::new();
        for _ in 0..PORT_TRIES_MAX {
            cluster.port = free_port()?;
            match cluster.pg_ctl_start() {
                Ok(()) => {
                    cluster.running = true;
                    return Ok(cluster);
                }
                Err(error) => last = format!("{error:#}"),
            }
        }
        bail!("PostgreSQL did not start in {PORT_TRIES_MAX} tries; last: {last}")
    }

    /// A URL for the cluster's `postgres` database as the `postgres` superuser (trust auth,
    /// loopback only).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn init(&self) -> anyhow::Result<()> {
        if let Some((uid, gid)) = running_as_root().then(postgres_user).flatten() {
            std::os::unix::fs::chown(&self.dir, Some(uid), Some(gid))
                .with_context(|| format!("handing {} to the postgres user", self.dir.display()))?;
        }
        let data = self.data();
        let mut initdb = server_command(&self.bin.join("initdb"));
        initdb.arg("-D").arg(&data).args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync"]);
        checked(initdb, "initdb")
    }

    fn pg_ctl_start(&self) -> anyhow::Result<()> {
        // TCP on loopback only (no Unix socket: the folder's path may be too long for one);
        // fsync off: a throwaway cluster survives a killed server, not a killed machine.
        let options =
            format!("-h 127.0.0.1 -p {} -k '' -c fsync=off -c full_page_writes=off -c max_connections=200", self.port);
        let mut start = server_command(&self.bin.join("pg_ctl"));
        start.arg("-D").arg(self.data()).arg("-l").arg(self.dir.join("server.log"));
        start.args(["-w", "-t", &PG_CTL_WAIT_S.to_string(), "-o", &options, "start"]);
        checked(start, "pg_ctl start").map_err(|error| {
            let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            error.context(format!("server log: {}", tail.into_iter().rev().collect::<Vec<_>>().join(" | ")))
        })
    }

    /// Stops the server (fast shutdown) and removes the folder. Called on drop too.
    pub fn stop(&mut self) {
        if self.running {
            stop_server(&self.bin, &self.data());
            self.running = false;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for TempCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

fn create_parent(parent: &Path) -> anyhow::Result<()> {
    if parent.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    // Sticky and open to all, like /tmp: clusters of other users (or of root as `postgres`) share it.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o1777))?;
    Ok(())
}

/// A command for a server binary: as the `postgres` user when we are root.
fn server_command(program: &Path) -> Command {
    if running_as_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn checked(mut command: Command, what: &str) -> anyhow::Result<()> {
    let output: Output = command.output().with_context(|| format!("running {what}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        bail!("{what} failed ({}): {}", output.status, stderr.trim());
    }
    Ok(())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

/// Stops a server: `pg_ctl stop -m fast`, then SIGKILL to the postmaster if it is still there.
fn stop_server(bin: &Path, data: &Path) {
    let mut stop = server_command(&bin.join("pg_ctl"));
    stop.arg("-D").arg(data).args(["-m", "fast", "-w", "-t", &PG_CTL_WAIT_S.to_string(), "stop"]);
    let _ = stop.output();
    if let Some(pid) = postmaster_pid(data) {
        // SAFETY: kill with a pid read from the cluster's own postmaster.pid.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// The postmaster's pid, if its pid file names a live process.
fn postmaster_pid(data: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    let pid: i32 = text.lines().next()?.trim().parse().ok()?;
    // SAFETY: signal 0 only checks that the process exists.
    (pid > 0 && unsafe { libc::kill(pid, 0) } == 0).then_some(pid)
}

/// Removes every cluster folder under `parent` whose starting process is gone, stopping its
/// server first. Returns the folders removed and their owners' pids.
pub fn clean_stale(parent: &Path) -> Vec<(PathBuf, u32)> {
    let mut removed = vec![];
    let Ok(entries) = std::fs::read_dir(parent) else { return removed };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut parts = name.strip_prefix("cluster-").unwrap_or_default().split('-');
        let (Some(Ok(pid)), Some(Ok(started))) =
            (parts.next().map(str::parse::<u32>), parts.next().map(str::parse::<u64>))
        else {
            continue;
        };
        if start_time(pid) == Some(started) {
            continue;
        }
        let dir = entry.path();
        if let Some(bin) = bin_dir() {
            if postmaster_pid(&dir.join("data")).is_some() {
                stop_server(&bin, &dir.join("data"));
            }
        }
        if std::fs::remove_dir_all(&dir).is_ok() {
            removed.push((dir, pid));
        }
    }
    removed
}
