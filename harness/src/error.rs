//! The one error every `fencelab` command answers with when it cannot reach a verdict, and
//! how the libraries' typed errors map onto it. A verdict (valid, invalid, unknown) is not an
//! error: a command returns it as its [`Exit`]; an error is bad input (254, nothing was
//! started or changed) or an internal failure (255).

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
}

impl CommandError {
    /// Its row of the exit table.
    pub fn exit(&self) -> Exit {
        match self {
            CommandError::BadArguments(_) => Exit::BadArguments,
            CommandError::Internal(_) => Exit::Internal,
        }
    }

    /// The same error with a last line telling how to repeat the command.
    pub fn repeat_with(self, command: &str) -> CommandError {
        match self {
            CommandError::BadArguments(message) => {
                CommandError::BadArguments(format!("{message}\nrepeat with: {command}"))
            }
            CommandError::Internal(message) => CommandError::Internal(format!("{message}\nrepeat with: {command}")),
        }
    }
}

impl From<system::StartError> for CommandError {
    /// A system that could not start because of something the user named wrongly (a program
    /// that is not there, an unknown variant) is bad input; any other failure is internal.
    fn from(error: system::StartError) -> CommandError {
        match error {
            system::StartError::Named(message) => CommandError::BadArguments(message),
            system::StartError::Failed(message) => CommandError::Internal(message),
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

impl From<engine::error::RunError> for CommandError {
    /// A system's start or a folder's file keeps its own row; anything else that stopped a
    /// run is an internal failure.
    fn from(error: engine::error::RunError) -> CommandError {
        match error {
            engine::error::RunError::Start(start) => CommandError::from(start),
            engine::error::RunError::Folder(folder) => CommandError::from(folder),
            other => CommandError::Internal(other.to_string()),
        }
    }
}

impl From<verdict::check::FolderError> for CommandError {
    /// A folder whose files are not what they should be is bad input; reports that cannot
    /// be written are an internal failure.
    fn from(error: verdict::check::FolderError) -> CommandError {
        match error {
            verdict::check::FolderError::Bad(message) => CommandError::BadArguments(message),
            verdict::check::FolderError::Write(message) => CommandError::Internal(message),
        }
    }
}

impl From<anyhow::Error> for CommandError {
    /// An internal failure, unless it is a system's start failing on a wrong name.
    fn from(error: anyhow::Error) -> CommandError {
        let error = match error.downcast::<system::StartError>() {
            Ok(start) => return CommandError::from(start),
            Err(error) => error,
        };
        match error.downcast::<verdict::check::FolderError>() {
            Ok(folder) => CommandError::from(folder),
            Err(error) => CommandError::Internal(format!("{error:#}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_library_error_lands_on_its_row_of_the_exit_table() {
        let named = CommandError::from(system::StartError::Named("no such program".into()));
        assert_eq!(named.exit(), Exit::BadArguments);
        let failed = CommandError::from(anyhow::Error::from(system::StartError::Failed("died".into())));
        assert_eq!(failed.exit(), Exit::Internal);
        let wrapped = CommandError::from(anyhow::Error::from(system::StartError::Named("bad variant".into())));
        assert_eq!(wrapped.exit(), Exit::BadArguments, "a wrong name inside anyhow is still bad input");
        let bad = CommandError::from(engine::scenario::ScenarioError::Bad("line 3: unknown key".into()));
        assert_eq!(bad.exit(), Exit::BadArguments);
        assert_eq!(CommandError::from(anyhow::anyhow!("disk full")).exit(), Exit::Internal);
        let run_named = engine::error::RunError::Start(system::StartError::Named("no such variant".into()));
        assert_eq!(CommandError::from(run_named).exit(), Exit::BadArguments, "a run's wrong name is bad input");
        let folder = engine::error::RunError::Folder(verdict::check::FolderError::Bad("config.json line 1".into()));
        assert_eq!(CommandError::from(folder).exit(), Exit::BadArguments);
        let unhealthy = CommandError::from(engine::error::RunError::Unhealthy(std::time::Duration::from_secs(60)));
        assert_eq!(
            (unhealthy.exit(), unhealthy.to_string()),
            (Exit::Internal, "the cluster was not healthy within 60s".to_string())
        );
        let repeated = CommandError::Internal("broke".into()).repeat_with("fencelab run --seed 1");
        assert_eq!(repeated.to_string(), "broke\nrepeat with: fencelab run --seed 1");
        let named = CommandError::BadArguments("no image".into()).repeat_with("fencelab run --seed 2");
        assert_eq!(
            (named.exit(), named.to_string().ends_with("repeat with: fencelab run --seed 2")),
            (Exit::BadArguments, true)
        );
    }
}
