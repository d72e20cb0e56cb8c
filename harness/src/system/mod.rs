//! The system under test, as its system file describes it (`docs/system.md`): the lab
//! (`systems/lab.toml`, the default) or any implementation of the contract.

pub mod file;
pub mod launch;

use std::path::PathBuf;
use std::time::Duration;

use protocol::client::Client;
use protocol::RegisterRunner;

pub use file::{Feature, Role, SystemFile};
pub use launch::{ClockControl, Launch, Proc, Server, StartError};

/// A running system: its control plane, its target (when it has one), and the operator's
/// client.
pub struct RunningSystem {
    pub launch: Launch,
    pub control: Server,
    pub target: Option<Server>,
    pub operator: Client,
}

/// How long a request of the harness's own to a system may wait during start (5 s).
const START_REQUEST_MAX: Duration = Duration::from_secs(5);

impl RunningSystem {
    /// Starts the target and the control plane (side by side) and creates the project.
    pub async fn start(launch: Launch) -> Result<RunningSystem, StartError> {
        launch.file.check_variants(&launch.variants).map_err(|error| StartError::Named(error.to_string()))?;
        std::fs::create_dir_all(&launch.dir)
            .map_err(|error| StartError::Failed(format!("{}: {error}", launch.dir.display())))?;
        let has_target = launch.file.roles.contains_key(&Role::Target);
        let target = async {
            if has_target {
                launch.start_server(Role::Target, 0).await.map(Some)
            } else {
                Ok(None)
            }
        };
        let (control, target) = tokio::join!(launch.start_server(Role::ControlPlane, 0), target);
        let (control, target) = (control?, target?);
        let operator = Client::new(&control.url(), Some(&launch.file.operator_token), START_REQUEST_MAX);
        operator.create_project(&launch.file.project).await.map_err(|error| {
            StartError::Failed(format!(
                "{}: the control plane did not create project `{}` for the operator token: {error}",
                launch.file.locate(Role::ControlPlane),
                launch.file.project
            ))
        })?;
        Ok(RunningSystem { launch, control, target, operator })
    }

    pub fn control_url(&self) -> String {
        self.control.url()
    }

    /// The target's URL; a system without a target has none.
    pub fn target_url(&self) -> Option<String> {
        self.target.as_ref().map(Server::url)
    }

    /// SIGKILLs the control plane and starts it again with the same command, store and port.
    pub async fn restart_control(&mut self) -> Result<(), StartError> {
        let port = self.control.addr.port();
        self.control.proc.kill().await;
        self.control = self.launch.start_server(Role::ControlPlane, port).await?;
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
        self.control.proc.stop(Duration::from_secs(2)).await;
        if let Some(target) = self.target.as_mut() {
            target.proc.stop(Duration::from_secs(2)).await;
        }
    }
}
