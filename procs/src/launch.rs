//! Starting lab processes: each child runs in its own process group, dies with its parent
//! (`PR_SET_PDEATHSIG`), and announces its listening address as one JSON line on stdout.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a server may take to announce its address (10 s).
pub const ANNOUNCE_WAIT_MAX: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("cannot start {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("{program} did not announce an address within {waited:?} (it said: {said:?})")]
    NoAddress { program: String, waited: Duration, said: String },
}

/// A started lab process.
pub struct Process {
    pub child: Child,
    /// The address it listens on, for servers.
    pub addr: Option<SocketAddr>,
}

impl Process {
    pub fn pid(&self) -> i32 {
        self.child.id().map_or(0, |pid| pid as i32)
    }

    /// Sends a signal to the process (not its group).
    pub fn signal(&self, signal: i32) -> bool {
        let pid = self.pid();
        // SAFETY: kill(2) with a pid we started; a stale pid only yields an error.
        pid > 0 && unsafe { libc::kill(pid, signal) } == 0
    }

    /// SIGKILLs the process and reaps it.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`.
    pub async fn stop(&mut self, grace: Duration) {
        self.signal(libc::SIGTERM);
        if tokio::time::timeout(grace, self.child.wait()).await.is_err() {
            self.kill().await;
        }
    }
}

/// The command for `program` with the lab's process hygiene applied.
pub fn command(program: &Path, args: &[impl AsRef<OsStr>], stderr_log: Option<&Path>) -> std::io::Result<Command> {
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).kill_on_drop(true);
    command.stderr(match stderr_log {
        Some(path) => Stdio::from(std::fs::OpenOptions::new().create(true).append(true).open(path)?),
        None => Stdio::inherit(),
    });
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    Ok(command)
}

/// Starts a server and waits (bounded) for its `{"listening": ADDR}` line.
pub async fn server(mut command: Command, name: &str) -> Result<Process, LaunchError> {
    let mut child = command.spawn().map_err(|source| LaunchError::Spawn { program: name.to_string(), source })?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(ANNOUNCE_WAIT_MAX, lines.next_line()).await;
    let said = match &first {
        Ok(Ok(Some(line))) => line.clone(),
        _ => String::new(),
    };
    let addr = serde_json::from_str::<serde_json::Value>(&said)
        .ok()
        .and_then(|value| value["listening"].as_str().and_then(|addr| addr.parse().ok()));
    let Some(addr) = addr else {
        let _ = child.kill().await;
        return Err(LaunchError::NoAddress { program: name.to_string(), waited: ANNOUNCE_WAIT_MAX, said });
    };
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Process { child, addr: Some(addr) })
}

/// Starts a process that is not a server.
pub fn plain(mut command: Command, name: &str) -> Result<Process, LaunchError> {
    command.stdout(Stdio::null());
    let child = command.spawn().map_err(|source| LaunchError::Spawn { program: name.to_string(), source })?;
    Ok(Process { child, addr: None })
}
