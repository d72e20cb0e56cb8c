//! The one error every `fencelab` command answers with when it cannot reach a verdict, and
//! how the libraries' typed errors map onto it. A verdict (valid, invalid, unknown) is not an
//! error: a command returns it as its [`Exit`]; an error is bad input (254, nothing was
//! started or changed) or an internal failure (255). Which one is decided by matching the
//! error's variant, never by its message.

use history::Exit;

/// Why a command could not answer.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// Bad arguments or input: nothing was started and nothing was changed (254).
    #[error("{0}")]
    BadArguments(String),
    /// Something broke while the command ran (255).
    #[error("{0}")]
    Internal(String),
    /// A system that did not start: named wrongly by the user (254) or failed (255).
    #[error(transparent)]
    Start(#[from] system::StartError),
    /// A run folder whose files are not what they should be (254) or could not be written (255).
    #[error(transparent)]
    Folder(#[from] runfolder::folder::FolderError),
    /// Any other failure of what the command ran (255).
    #[error("{0:#}")]
    Other(#[from] anyhow::Error),
    /// An error, and a last line telling how to repeat the command.
    #[error("{error}\nrepeat with: {command}")]
    Repeat { error: Box<CommandError>, command: String },
}

impl CommandError {
    /// Its row of the exit table.
    pub fn exit(&self) -> Exit {
        match self {
            CommandError::BadArguments(_)
            | CommandError::Start(system::StartError::Named(_))
            | CommandError::Folder(runfolder::folder::FolderError::Bad(_)) => Exit::BadArguments,
            CommandError::Internal(_)
            | CommandError::Start(system::StartError::Failed(_))
            | CommandError::Folder(runfolder::folder::FolderError::Write(_))
            | CommandError::Other(_) => Exit::Internal,
            CommandError::Repeat { error, .. } => error.exit(),
        }
    }

    /// The same error with a last line telling how to repeat the command.
    pub fn repeat_with(self, command: &str) -> CommandError {
        CommandError::Repeat { error: Box::new(self), command: command.to_string() }
    }
}

impl From<engine::error::RunError> for CommandError {
    /// A system's start and a folder's file keep their own rows; anything else that stopped
    /// a run is an internal failure.
    fn from(error: engine::error::RunError) -> CommandError {
        match error {
            engine::error::RunError::Start(start) => CommandError::Start(start),
            engine::error::RunError::Folder(folder) => CommandError::Folder(folder),
            other => CommandError::Internal(other.to_string()),
        }
    }
}

impl From<engine::scenario::ScenarioError> for CommandError {
    fn from(error: engine::scenario::ScenarioError) -> CommandError {
        match error {
            engine::scenario::ScenarioError::Bad(message) => CommandError::BadArguments(message),
            engine::scenario::ScenarioError::Internal(error) => CommandError::from(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_library_error_lands_on_its_row_of_the_exit_table() {
        let named = CommandError::from(system::StartError::Named("no such program".into()));
        assert_eq!((named.exit(), named.to_string()), (Exit::BadArguments, "no such program".to_string()));
        let run = |error: engine::error::RunError| CommandError::from(error);
        let failed = run(engine::error::RunError::Start(system::StartError::Failed("died".into())));
        assert_eq!(failed.exit(), Exit::Internal);
        let wrapped = run(engine::error::RunError::Start(system::StartError::Named("bad variant".into())));
        assert_eq!(wrapped.exit(), Exit::BadArguments, "a wrong name inside the engine's error is still bad input");
        let folder = run(engine::error::RunError::Folder(runfolder::folder::FolderError::Bad("line 2".into())));
        assert_eq!(folder.exit(), Exit::BadArguments);
        let unhealthy = run(engine::error::RunError::Unhealthy(std::time::Duration::from_secs(60)));
        assert_eq!(
            (unhealthy.exit(), unhealthy.to_string()),
            (Exit::Internal, "the cluster was not healthy within 60s".to_string())
        );
        let unwritten = CommandError::from(runfolder::folder::FolderError::Write("disk full".into()));
        assert_eq!(unwritten.exit(), Exit::Internal);
        let bad = CommandError::from(engine::scenario::ScenarioError::Bad("line 3: unknown key".into()));
        assert_eq!(bad.exit(), Exit::BadArguments);
        let other = CommandError::from(anyhow::anyhow!("disk full").context("writing matrix.json"));
        assert_eq!((other.exit(), other.to_string()), (Exit::Internal, "writing matrix.json: disk full".to_string()));
        let repeated = CommandError::Internal("broke".into()).repeat_with("fencelab run --seed 1");
        assert_eq!(repeated.to_string(), "broke\nrepeat with: fencelab run --seed 1");
        let named = CommandError::BadArguments("no image".into()).repeat_with("fencelab run --seed 2");
        assert_eq!(
            (named.exit(), named.to_string().ends_with("repeat with: fencelab run --seed 2")),
            (Exit::BadArguments, true)
        );
        let start = CommandError::from(system::StartError::Named("no image".into())).repeat_with("fencelab run");
        assert_eq!(
            (start.exit(), start.to_string()),
            (Exit::BadArguments, "no image\nrepeat with: fencelab run".into())
        );
    }
}
