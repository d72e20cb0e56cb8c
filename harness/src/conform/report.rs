//! What `fencelab conform` leaves behind: one line per case on stdout, `conform.json`
//! (written and read back through [`ConformDoc`]) and `junit.xml` (one test case per case:
//! a failure is a `<failure>`, a skip a `<skipped>` with its reason).

use std::fmt::Write;
use std::path::Path;

use results::escape::{xml, xml_body};
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

pub fn read(path: &Path) -> Result<ConformDoc, String> {
    let text = std::fs::read_to_string(path).map_err(|error| format!("{}: {error}", path.display()))?;
    serde_json::from_str(&text).map_err(|error| format!("{}: {error}", path.display()))
}

pub fn write(doc: &ConformDoc, dir: &Path) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(doc).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("conform.json"), json)?;
    std::fs::write(dir.join("junit.xml"), junit(doc))
}

fn seconds(ms: u64) -> String {
    format!("{}.{:03}", ms / 1_000, ms % 1_000)
}

pub fn junit(doc: &ConformDoc) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuite name=\"fencelab.conform.{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{}\" time=\"{}\" timestamp=\"{}\">",
        xml(&doc.name),
        doc.cases.len(),
        doc.counts.fail,
        doc.counts.skip,
        seconds(doc.duration_ms),
        xml(&doc.started_at),
    );
    out.push_str("  <properties>\n");
    for (name, value) in [
        ("system", doc.system.clone()),
        ("variants", doc.variants.join(",")),
        ("lease_ms", doc.lease_ms.to_string()),
        ("command", doc.command.clone()),
        ("overall", doc.overall.to_string()),
        ("exit_code", doc.exit_code.to_string()),
    ] {
        let _ = writeln!(out, "    <property name=\"{name}\" value=\"{}\"/>", xml(&value));
    }
    out.push_str("  </properties>\n");
    for case in &doc.cases {
        let group = case.name.split('/').next().unwrap_or("conform");
        let _ = write!(
            out,
            "  <testcase classname=\"fencelab.conform.{}\" name=\"{}\" time=\"{}\"",
            xml(group),
            xml(&case.name),
            seconds(case.duration_ms)
        );
        match case.status {
            Status::Pass => out.push_str("/>\n"),
            Status::Fail => {
                let _ = writeln!(
                    out,
                    ">\n    <failure type=\"fail\" message=\"{}\">{}</failure>\n  </testcase>",
                    xml(&case.evidence),
                    xml_body(&case.evidence)
                );
            }
            Status::Skip => {
                let _ = writeln!(out, ">\n    <skipped message=\"{}\"/>\n  </testcase>", xml(&case.evidence));
            }
        }
    }
    out.push_str("</testsuite>\n");
    out
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
        assert!(xml.contains("<failure type=\"fail\" message=\"why &lt;rule/y&gt;\">"), "{xml}");
        assert!(xml.contains("<skipped message=\"why &lt;target/z&gt;\"/>"), "{xml}");
        let text = serde_json::to_string(&doc).unwrap();
        assert_eq!(serde_json::from_str::<ConformDoc>(&text).unwrap(), doc, "conform.json reads back");
    }
}
