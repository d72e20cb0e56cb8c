//! What `fencelab conform` leaves behind: one line per case on stdout, `conform.json`
//! (written and read back through [`ConformDoc`]) and `junit.xml` (one test case per case:
//! a failure is a `<failure>`, a skip a `<skipped>` with its reason).

use std::path::Path;

use results::Overall;
use serde::{Deserialize, Serialize};

use super::case::{CaseResult, Status};

pub const SCHEMA: &str = "fencelab.conform/1";

/// How many cases passed, failed and were skipped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Counts {
    pub pass: usize,
    pub fail: usize,
    pub skip: usize,
}

/// `conform.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConformDoc {
    pub schema: String,
    /// The system file (`<built-in lab>` for the lab) and its name.
    pub system: String,
    pub name: String,
    pub variants: Vec<String>,
    pub lease_ms: u64,
    pub started_at: String,
    pub duration_ms: u64,
    /// `valid` when every case passed, `invalid` when one failed, else `unknown`.
    pub overall: Overall,
    pub exit_code: u8,
    pub counts: Counts,
    /// The command that repeats this.
    pub command: String,
    pub cases: Vec<CaseResult>,
}

pub fn counts(cases: &[CaseResult]) -> Counts {
    let count = |status| cases.iter().filter(|case| case.status == status).count();
    Counts { pass: count(Status::Pass), fail: count(Status::Fail), skip: count(Status::Skip) }
}

/// Any failure is invalid; otherwise any skip (or no case at all) is unknown: a case not
/// judged is never a pass.
pub fn overall(counts: Counts) -> Overall {
    if counts.fail > 0 {
        Overall::Invalid
    } else if counts.skip > 0 || counts.pass == 0 {
        Overall::Unknown
    } else {
        Overall::Valid
    }
}

/// The case's line: status word, name, evidence.
pub fn line(case: &CaseResult) -> String {
    format!("{}  {:<40} {}", case.status.word(), case.name, case.evidence)
}

/// Why a `conform.json` cannot be read back; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{}: {source}", path.display())]
    Io { path: std::path::PathBuf, source: std::io::Error },
    #[error("{}: {source}", path.display())]
    Json { path: std::path::PathBuf, source: serde_json::Error },
}

/// Reads a `conform.json` back into its type.
pub fn read(path: &Path) -> Result<ConformDoc, ReadError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReadError::Io { path: path.to_path_buf(), source })?;
    serde_json::from_str(&text).map_err(|source| ReadError::Json { path: path.to_path_buf(), source })
}

pub fn write(doc: &ConformDoc, dir: &Path) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(doc).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("conform.json"), json)?;
    std::fs::write(dir.join("junit.xml"), junit(doc))
}

/// `junit.xml`: a test case per conformance case, grouped by the case's family, through
/// the one JUnit model (`results::junit`).
pub fn junit(doc: &ConformDoc) -> String {
    use results::junit::{case, render, suite, Outcome};
    let properties = [
        ("system", doc.system.clone()),
        ("variants", doc.variants.join(",")),
        ("lease_ms", doc.lease_ms.to_string()),
        ("command", doc.command.clone()),
        ("overall", doc.overall.to_string()),
        ("exit_code", doc.exit_code.to_string()),
    ];
    let name = format!("fencelab.conform.{}", doc.name);
    let mut cases = suite(&name, Some(doc.duration_ms), &doc.started_at, &properties);
    for one in &doc.cases {
        let group = one.name.split('/').next().unwrap_or("conform");
        let outcome = match one.status {
            Status::Pass => Outcome::Passed,
            Status::Fail => {
                Outcome::Failed { kind: "fail".into(), message: one.evidence.clone(), body: one.evidence.clone() }
            }
            Status::Skip => Outcome::Skipped { message: one.evidence.clone() },
        };
        let classname = format!("fencelab.conform.{group}");
        cases.add_test_case(case(&one.name, &classname, Some(one.duration_ms), outcome));
    }
    render(&name, vec![cases])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(name: &str, status: Status) -> CaseResult {
        CaseResult { name: name.into(), status, evidence: format!("why <{name}>"), duration_ms: 12 }
    }

    #[test]
    fn a_skip_is_unknown_and_a_failure_invalid() {
        let pass = [case("a/x", Status::Pass)];
        assert_eq!(overall(counts(&pass)), Overall::Valid);
        let skip = [case("a/x", Status::Pass), case("a/y", Status::Skip)];
        assert_eq!(overall(counts(&skip)), Overall::Unknown);
        let fail = [case("a/x", Status::Fail), case("a/y", Status::Skip)];
        assert_eq!(overall(counts(&fail)), Overall::Invalid);
        assert_eq!(overall(counts(&[])), Overall::Unknown, "nothing judged is not a pass");
    }

    #[test]
    fn junit_has_one_testcase_per_case_and_escapes() {
        let cases = vec![case("rule/x", Status::Pass), case("rule/y", Status::Fail), case("target/z", Status::Skip)];
        let counts = counts(&cases);
        let doc = ConformDoc {
            schema: SCHEMA.into(),
            system: "s.toml".into(),
            name: "lab".into(),
            variants: vec![],
            lease_ms: 500,
            started_at: "t".into(),
            duration_ms: 1234,
            overall: overall(counts),
            exit_code: 1,
            counts,
            command: "fencelab conform".into(),
            cases,
        };
        let xml = junit(&doc);
        assert_eq!(xml.matches("<testcase ").count(), 3);
        assert!(xml.contains("failures=\"1\"") && xml.contains("skipped=\"1\""), "{xml}");
        assert!(xml.contains("<failure message=\"why &lt;rule/y&gt;\" type=\"fail\">"), "{xml}");
        assert!(xml.contains("<skipped message=\"why &lt;target/z&gt;\"/>"), "{xml}");
        let text = serde_json::to_string(&doc).unwrap();
        assert_eq!(serde_json::from_str::<ConformDoc>(&text).unwrap(), doc, "conform.json reads back");
    }
}
