//! What a conformance case answers besides a pass — a [`Finding`]: a failure, or a reason it
//! could not be judged — and the identity a case gives its ids ([`Case`]).

/// Why a case did not pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// The system broke the contract; the sentence says how.
    Fail(String),
    /// The case could not be judged; the sentence says why.
    Skip(String),
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Finding::Fail(why) | Finding::Skip(why) => f.write_str(why),
        }
    }
}

impl From<String> for Finding {
    fn from(message: String) -> Finding {
        Finding::Fail(message)
    }
}

/// What a case body answers: the evidence of a pass, or a finding.
pub type CaseOutcome = Result<String, Finding>;

/// Fails with `message` unless `holds`.
pub fn ensure(holds: bool, message: impl FnOnce() -> String) -> Result<(), Finding> {
    if holds {
        Ok(())
    } else {
        Err(Finding::Fail(message()))
    }
}

/// The identity a case gives its ids: its project, jobs, runners and keys are all
/// `<tag>.<name>`, so that cases running side by side never claim each other's jobs and a
/// ledger entry names the case it came from.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: &'static str,
    pub tag: String,
}

impl Case {
    /// `<tag>.<local>`.
    pub fn id(&self, local: &str) -> String {
        format!("{}.{local}", self.tag)
    }
}
