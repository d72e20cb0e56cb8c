//! Architecture invariants that a test enforces, so ARCHITECTURE.md cannot drift from the
//! code (as rust-analyzer's `tidy.rs`): which workspace crate may depend on which (the
//! table below, so no dependency circle and no shortcut appears); no crate above a quarter
//! of the workspace's source lines and the binary's crate thin; the pure crates depend on
//! nothing that reaches the outside world and their sources touch no file system,
//! network, process, clock or runtime; every Rust file opens with a `//!` comment;
//! operation names are written only through `history::Op`, never as string literals
//! compared against an event; a run folder's files are named only by its owner
//! (`runfolder::folder`); the `fencelab run` command line is written only by its one writer
//! (`RunConfig::command_words`); the history's `config` event is built and read only through
//! its one type (`history::Config`); the figures the documents state (checkers, fault variants,
//! conformance cases) are the code's; and errors are typed: no library's public function
//! returns `Result<_, String>` and the binary never downcasts an error to find its exit code.

use std::path::{Path, PathBuf};

/// The crates that take values and return values.
const PURE: &[&str] = &["history", "checkers", "results", "workloads"];

/// Dependencies a pure crate may not have: runtimes, I/O, clocks, and the impure crates.
const FORBIDDEN_DEPENDENCIES: &[&str] = &[
    "tokio",
    "reqwest",
    "axum",
    "hyper",
    "hyper-util",
    "rusqlite",
    "libc",
    "chrono",
    "lab",
    "proxy",
    "protocol",
    "harness",
];

/// Paths a pure crate's source may not name.
const FORBIDDEN_PATHS: &[&str] =
    &["std::fs", "std::net", "std::process", "std::thread", "std::env", "tokio::", "SystemTime", "Instant::", "File::"];

/// Every workspace crate and the workspace crates it may depend on (normal dependencies).
/// ARCHITECTURE.md draws this table; a dependency outside it fails.
pub const ALLOWED: &[(&str, &[&str])] = &[
    ("history", &[]),
    ("protocol", &["history"]),
    ("checkers", &["history"]),
    ("workloads", &["history"]),
    ("results", &["history", "checkers", "workloads"]),
    ("proxy", &[]),
    ("procs", &[]),
    ("lab", &["history", "protocol", "procs"]),
    ("system", &["history", "protocol", "workloads", "procs"]),
    ("runfolder", &["history", "workloads", "results", "lab", "system"]),
    ("verdict", &["history", "protocol", "checkers", "results", "system", "runfolder"]),
    (
        "engine",
        &[
            "history",
            "protocol",
            "workloads",
            "checkers",
            "results",
            "proxy",
            "procs",
            "lab",
            "system",
            "runfolder",
            "verdict",
        ],
    ),
    ("conform", &["history", "protocol", "checkers", "results", "system"]),
    (
        "campaign",
        &["history", "checkers", "workloads", "results", "procs", "lab", "system", "runfolder", "verdict", "engine"],
    ),
    (
        "harness",
        &[
            "history",
            "checkers",
            "workloads",
            "results",
            "proxy",
            "procs",
            "lab",
            "system",
            "runfolder",
            "verdict",
            "engine",
            "conform",
            "campaign",
        ],
    ),
];

/// The crates with a command line of their own, the only ones that may depend on clap: the
/// rest take validated values (`RunConfig`, `conform::Options`, `matrix::Options`).
const COMMAND_LINES: &[&str] = &["harness", "lab"];

/// The most source lines any one crate may hold, as a share of the workspace's.
const CRATE_SHARE_MAX: f64 = 0.25;
/// The most source lines of the binary's crate: the command line and nothing else.
const HARNESS_LINES_MAX: usize = 2_000;

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<PathBuf> = entries.map(|entry| entry.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The names in a Cargo.toml's `[dependencies]` table.
fn dependencies(manifest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut inside = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
        } else if inside && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['=', '.', ' ']).next().unwrap_or_default();
            names.push(name.to_string());
        }
    }
    names
}

/// What is wrong with a pure crate's manifest.
fn manifest_violations(krate: &str, manifest: &str) -> Vec<String> {
    dependencies(manifest)
        .into_iter()
        .filter(|name| FORBIDDEN_DEPENDENCIES.contains(&name.as_str()))
        .map(|name| format!("{krate}/Cargo.toml: the pure crate `{krate}` depends on `{name}`"))
        .collect()
}

/// What is wrong with a pure crate's source file (comments included: a path named in a
/// comment is rare and cheap to reword).
fn pure_source_violations(path: &str, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        for forbidden in FORBIDDEN_PATHS {
            if line.contains(forbidden) && !line.trim_start().starts_with("//") {
                found.push(format!("{path}:{}: a pure crate names `{forbidden}`", number + 1));
            }
        }
    }
    found
}

/// Every Rust file opens with a module comment.
fn module_doc_violation(path: &str, text: &str) -> Option<String> {
    (!text.starts_with("//!")).then(|| format!("{path}: does not open with a `//!` comment"))
}

/// Whether the fourth argument of an `Event::new(` on this line is a string literal.
fn builds_with_literal_op(line: &str) -> bool {
    let Some((_, arguments)) = line.split_once("Event::new(") else { return false };
    arguments.split(',').nth(3).is_some_and(|op| op.trim_start().starts_with('"'))
}

/// `line` with the contents of its string literals removed (the quotes stay).
fn without_literals(line: &str) -> String {
    let (mut code, mut inside, mut escaped) = (String::new(), false, false);
    for c in line.chars() {
        match (inside, escaped, c) {
            (true, false, '\\') => escaped = true,
            (true, true, _) => escaped = false,
            (_, _, '"') => {
                inside = !inside;
                code.push(c);
            }
            (false, _, _) => code.push(c),
            (true, false, _) => {}
        }
    }
    code
}

/// An operation compared or built as a string literal (an event's `f` compared with a
/// literal, directly or through `as_str()`, matched as a word, or `Event::new` given one)
/// outside the `history` crate.
fn op_literal_violations(path: &str, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate().filter(|(_, line)| !line.trim_start().starts_with("//")) {
        let compared =
            [".f == \"", ".f != \"", ".f.as_str() == \"", ".f.as_str() != \""].iter().any(|p| line.contains(p)) || {
                let code = without_literals(line);
                code.contains("match ") && code.contains(".f.as_str()")
            };
        let built = builds_with_literal_op(line);
        if compared || built {
            found.push(format!("{path}:{}: an operation written as a string literal: {}", number + 1, line.trim()));
        }
    }
    found
}

/// The files of a run folder, which only `RUN_FOLDER_OWNER` names.
const RUN_FOLDER_FILES: &[&str] = &[
    "config.json",
    "run.json",
    "schedule.json",
    "jobs.json",
    "endpoints.json",
    "history.jsonl",
    "results.json",
    "report.html",
];

/// The one module that creates, writes and reads a run folder.
const RUN_FOLDER_OWNER: &str = "runfolder/src/folder.rs";

/// A run folder's file named, as a string literal, outside its owner.
fn run_folder_violations(path: &str, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        for name in RUN_FOLDER_FILES.iter().filter(|name| line.contains(&format!("\"{name}\""))) {
            found.push(format!(
                "{path}:{}: names the run folder's {name}, which only {RUN_FOLDER_OWNER} does",
                number + 1
            ));
        }
    }
    found
}

/// Flags of `fencelab run` that no other command takes (besides `fencelab matrix
/// --nemesis`, whose command line nothing writes), which only `RUN_COMMAND_WRITER` writes.
const RUN_FLAGS: &[&str] = &[
    "--test-name",
    "--runners",
    "--keys",
    "--rate",
    "--nemesis",
    "--target-mode",
    "--heartbeat-interval-ms",
    "--reconcile-after-ms",
    "--steps-min",
    "--steps-max",
    "--step-ms-min",
    "--step-ms-max",
    "--recovery-limit",
    "--toxiproxy-url",
    "--toxiproxy-image",
    "--schedule",
    "--control-planes",
    "--stop-at-first",
];

/// The one writer of the `fencelab run` command line (`RunConfig::command_words`).
const RUN_COMMAND_WRITER: &str = "runfolder/src/config.rs";

/// A flag of `fencelab run` written as a whole string literal (a word of a command line)
/// outside its one writer; an error message that names a flag is not a word.
fn run_command_violations(path: &str, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate().filter(|(_, line)| !line.trim_start().starts_with("//")) {
        for flag in RUN_FLAGS.iter().filter(|flag| line.contains(&format!("\"{flag}\""))) {
            found.push(format!(
                "{path}:{}: writes `fencelab run`'s {flag}, which only {RUN_COMMAND_WRITER} does",
                number + 1
            ));
        }
    }
    found
}

/// The one module that builds and reads the history's `config` event (`history::Config`).
const CONFIG_EVENT_OWNER: &str = "history/src/config.rs";

/// How a reader would take a key of the `config` event by hand.
const CONFIG_EVENT_KEYS: &[&str] =
    &["get(\"lease_ms\")", "get(\"renewal_margin_ms\")", "get(\"target_mode\")", "pointer(\"/system/"];

/// The crates and modules whose verdicts, reports and imports read the `config` event: only
/// through its type.
const CONFIG_EVENT_READERS: &[&str] = &[
    "checkers/",
    "results/",
    "verdict/src/check.rs",
    "verdict/src/evidence.rs",
    "verdict/src/audit.rs",
    "engine/src/import.rs",
];

/// A `config` event built (`Event::new` or a recorder's `record` given `Op::Config`)
/// outside its owner, or, in a checker or report, one of its keys read by hand; a file's
/// tests (after its first `#[cfg(test)]`) may build one by hand.
fn config_event_violations(path: &str, text: &str) -> Vec<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    let reader = CONFIG_EVENT_READERS.iter().any(|krate| path.starts_with(krate));
    let mut found = Vec::new();
    for (number, line) in code.lines().enumerate().filter(|(_, line)| !line.trim_start().starts_with("//")) {
        let built = line.contains("Op::Config") && (line.contains("Event::new(") || line.contains(".record("));
        let read = reader && CONFIG_EVENT_KEYS.iter().any(|key| line.contains(key));
        if built || read {
            found.push(format!(
                "{path}:{}: builds or reads the `config` event by hand, which only {CONFIG_EVENT_OWNER} does: {}",
                number + 1,
                line.trim()
            ));
        }
    }
    found
}

/// The binary's crate, the only one whose errors may be `anyhow` and where libraries' errors
/// end; every other crate is a library.
const BINARY: &str = "harness";

/// The return type of the function whose signature starts `signature` (from `fn` on): what
/// follows the parameters' closing parenthesis, up to the body, a `where` or a `;`.
fn return_type(signature: &str) -> Option<String> {
    let open = signature.find('(')?;
    let mut depth = 0;
    for (at, character) in signature[open..].char_indices() {
        match character {
            '(' => depth += 1,
            ')' if depth == 1 => {
                let rest = signature[open + at + 1..].trim_start().strip_prefix("->")?;
                let end = rest.find(['{', ';']).unwrap_or(rest.len());
                let end = rest[..end].find(" where").unwrap_or(end);
                return Some(rest[..end].split_whitespace().collect::<Vec<_>>().join(" "));
            }
            ')' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// A library's public function whose error is a bare `String` (its signature read across
/// lines): errors are typed (thiserror), each carrying its message and its source.
fn string_error_violations(path: &str, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (number, line) in lines.iter().enumerate() {
        let words = line.trim_start();
        let public = ["pub fn ", "pub async fn ", "pub const fn "].iter().any(|start| words.starts_with(start));
        if !public {
            continue;
        }
        let signature = lines[number..].iter().take(12).copied().collect::<Vec<_>>().join(" ");
        let returns = return_type(&signature[signature.find("fn ").unwrap_or(0)..]).unwrap_or_default();
        if returns.starts_with("Result<") && returns.replace(", ", ",").ends_with(",String>") {
            found.push(format!("{path}:{}: a public function returns `{returns}`: give it a typed error", number + 1));
        }
    }
    found
}

/// `downcast` in the binary: its commands carry their error's type (`CommandError`), and the
/// exit code is a match on it.
fn downcast_violations(path: &str, text: &str) -> Vec<String> {
    let code = text.lines().enumerate().filter(|(_, line)| !line.trim_start().starts_with("//"));
    code.filter(|(_, line)| line.contains("downcast"))
        .map(|(number, _)| format!("{path}:{}: a downcast: carry the error's type instead", number + 1))
        .collect()
}

#[test]
fn libraries_return_typed_errors_and_the_binary_never_downcasts() {
    let root = workspace();
    let mut violations = Vec::new();
    for krate in crates().into_iter().filter(|krate| krate != BINARY) {
        let mut files = Vec::new();
        rust_files(&root.join(&krate).join("src"), &mut files);
        for file in files {
            violations.extend(string_error_violations(&relative(&file), &std::fs::read_to_string(&file).unwrap()));
        }
    }
    let mut files = Vec::new();
    rust_files(&root.join(BINARY).join("src"), &mut files);
    assert!(files.len() > 3, "the binary's sources were not found");
    for file in files {
        violations.extend(downcast_violations(&relative(&file), &std::fs::read_to_string(&file).unwrap()));
    }
    assert!(violations.is_empty(), "untyped errors:\n{}", violations.join("\n"));
}

fn relative(path: &Path) -> String {
    path.strip_prefix(workspace()).unwrap_or(path).display().to_string()
}

/// What breaks the dependency table: a workspace crate depending on one it may not, or a
/// crate the table does not know.
fn dependency_violations(krate: &str, manifest: &str) -> Vec<String> {
    let workspace: Vec<&str> = ALLOWED.iter().map(|(name, _)| *name).collect();
    let Some((_, allowed)) = ALLOWED.iter().find(|(name, _)| *name == krate) else {
        return vec![format!("{krate}: a crate the dependency table in tidy.rs does not know")];
    };
    let mut found: Vec<String> = dependencies(manifest)
        .into_iter()
        .filter(|name| workspace.contains(&name.as_str()) && !allowed.contains(&name.as_str()))
        .map(|name| format!("{krate}/Cargo.toml: `{krate}` may not depend on `{name}` (ARCHITECTURE.md)"))
        .collect();
    if !COMMAND_LINES.contains(&krate) && dependencies(manifest).iter().any(|name| name == "clap") {
        found.push(format!("{krate}/Cargo.toml: `{krate}` depends on clap: flags are the command line's"));
    }
    found
}

/// Source lines per crate, and what is over the limits.
fn size_violations(lines: &[(String, usize)]) -> Vec<String> {
    let total: usize = lines.iter().map(|(_, count)| count).sum();
    let mut found = Vec::new();
    for (krate, count) in lines {
        if *count as f64 > CRATE_SHARE_MAX * total as f64 {
            found.push(format!(
                "{krate}/src holds {count} of {total} lines, above a quarter: two crates waiting to be split"
            ));
        }
        if krate == "harness" && *count > HARNESS_LINES_MAX {
            found.push(format!(
                "harness/src holds {count} lines, above {HARNESS_LINES_MAX}: the binary's crate is the command line"
            ));
        }
    }
    found
}

#[test]
fn tidy_rules_catch_planted_violations() {
    let engine = "[package]\nname = \"engine\"\n[dependencies]\nsystem.workspace = true\nconform.workspace = true\n";
    assert_eq!(dependency_violations("engine", engine).len(), 1, "engine → conform is outside the table");
    let conform = "[dependencies]\nsystem.workspace = true\nengine.workspace = true\n";
    assert_eq!(dependency_violations("conform", conform).len(), 1, "conform never depends on engine");
    assert_eq!(dependency_violations("newcrate", "").len(), 1, "an unknown crate is named");
    let flags = "[dependencies]\nsystem.workspace = true\nclap.workspace = true\n";
    assert_eq!(dependency_violations("engine", flags).len(), 1, "only a command line's crate takes clap");
    assert_eq!(dependency_violations("harness", flags).len(), 0);
    let sizes = [("harness", 2_100), ("lab", 6_000), ("engine", 4_000), ("checkers", 4_000), ("results", 4_000)];
    let sizes: Vec<(String, usize)> = sizes.iter().map(|(name, lines)| (name.to_string(), *lines)).collect();
    assert_eq!(size_violations(&sizes).len(), 2, "lab above a quarter and harness above its limit");
    let manifest = "[package]\nname = \"checkers\"\n[dependencies]\nhistory.workspace = true\ntokio = { workspace = true }\n[dev-dependencies]\ntempfile = \"3\"\n";
    assert_eq!(manifest_violations("checkers", manifest).len(), 1, "tokio is flagged, dev-dependencies are not");
    assert_eq!(pure_source_violations("x.rs", "//! ok\nlet t = std::time::Instant::now();\n").len(), 1);
    assert_eq!(pure_source_violations("x.rs", "//! ok\n// std::fs in a comment is fine\n").len(), 0);
    assert!(module_doc_violation("x.rs", "use std::fmt;\n").is_some());
    assert_eq!(op_literal_violations("x.rs", "if event.f == \"heartbeat\" {").len(), 1);
    assert_eq!(op_literal_violations("x.rs", "let kind = match (e.kind, e.f.as_str()) {").len(), 1);
    assert_eq!(op_literal_violations("x.rs", "if e.f.as_str() == \"expire\" {").len(), 1);
    assert!(op_literal_violations("x.rs", "esc(e.f.as_str()),").is_empty(), "showing the word is not matching on it");
    assert_eq!(op_literal_violations("x.rs", "Event::new(0, p, EventType::Ok, \"claim\")").len(), 1);
    assert_eq!(op_literal_violations("x.rs", "if event.f == Op::Heartbeat {").len(), 0);
    assert_eq!(run_folder_violations("x.rs", "let path = folder.join(\"config.json\");").len(), 1);
    assert_eq!(run_folder_violations("x.rs", "format!(\"{} holds no results.json\", folder)").len(), 0);
    assert_eq!(run_command_violations("x.rs", "args.extend([\"--nemesis\".into(), nemesis]);").len(), 1);
    assert_eq!(run_command_violations("x.rs", "vec![\"--db\".into(), \"--control-planes\".into()]").len(), 1);
    assert_eq!(run_command_violations("x.rs", "Err(\"--runners must be 1..=512\".into())").len(), 0);
    let config = "let mut config = Event::new(0, Process::HARNESS, EventType::Ok, Op::Config);";
    assert_eq!(config_event_violations("x.rs", config).len(), 1);
    let read = "let lease = value.get(\"lease_ms\")?.as_u64();";
    assert_eq!(config_event_violations("checkers/src/x.rs", read).len(), 1);
    assert_eq!(config_event_violations("system/src/x.rs", read).len(), 0, "a system file's placeholder");
    assert_eq!(config_event_violations("x.rs", &format!("//! a module\n#[cfg(test)]\n{config}")).len(), 0);
    let strings = [
        ("pub fn read(path: &Path) -> Result<Suite, String> {", 1),
        ("pub async fn run(\n    program: &Path,\n) -> Result<(Client, String), String> {", 1),
        ("    pub fn validate(self) -> Result<RunConfig, String>\n    where\n        Self: Sized,\n{", 1),
        ("pub fn read(configure: impl Fn(&Run) -> Result<Config, String>) -> Result<Suite, SuiteError> {", 0),
        ("pub fn expand(values: &BTreeMap<&str, String>) -> Result<String, PlaceholderError> {", 0),
        ("pub async fn register_token(&self) -> anyhow::Result<String> {", 0),
        ("pub fn of_run(run: &Path) -> Result<Vec<String>, StartError> {", 0),
        ("pub(crate) fn submit(job: &Job) -> Result<(), String> {", 0),
        ("fn check(step: &Step) -> Result<(), String> {", 0),
    ];
    for (text, count) in strings {
        assert_eq!(string_error_violations("x.rs", text).len(), count, "{text}");
    }
    assert_eq!(downcast_violations("x.rs", "match error.downcast::<StartError>() {").len(), 1);
    assert_eq!(downcast_violations("x.rs", "let start = error.downcast_ref::<StartError>();").len(), 1);
    assert_eq!(downcast_violations("x.rs", "// never downcast: match the variant").len(), 0);
}

/// The workspace's crates (every folder with a Cargo.toml), in name order.
fn crates() -> Vec<String> {
    let mut crates: Vec<String> = std::fs::read_dir(workspace())
        .unwrap()
        .flatten()
        .filter(|entry| entry.path().join("Cargo.toml").is_file() && entry.path().join("src").is_dir())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    crates.sort();
    crates
}

#[test]
fn every_crate_depends_only_on_what_the_table_allows_and_none_outgrows_a_quarter() {
    let root = workspace();
    let mut violations = Vec::new();
    let mut lines = Vec::new();
    let crates = crates();
    assert!(crates.len() >= 12, "the workspace's crates were not found: {crates:?}");
    for krate in &crates {
        let manifest = std::fs::read_to_string(root.join(krate).join("Cargo.toml")).unwrap();
        violations.extend(dependency_violations(krate, &manifest));
        let mut files = Vec::new();
        rust_files(&root.join(krate).join("src"), &mut files);
        let count = files.iter().map(|file| std::fs::read_to_string(file).unwrap().lines().count()).sum();
        lines.push((krate.clone(), count));
    }
    violations.extend(size_violations(&lines));
    assert!(violations.is_empty(), "crate boundaries broken:\n{}", violations.join("\n"));
}

/// Every place a document states `figure` next to `words` (`"17 variants"`), as
/// (file, the number written).
fn stated(words: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let mut documents = vec![workspace().join("README.md"), workspace().join("ARCHITECTURE.md")];
    documents.extend(std::fs::read_dir(workspace().join("docs")).unwrap().flatten().map(|entry| entry.path()));
    for path in documents.into_iter().filter(|path| path.extension().is_some_and(|ext| ext == "md")) {
        let text = std::fs::read_to_string(&path).unwrap();
        let flat = text.replace('\n', " ");
        let mut rest = flat.as_str();
        while let Some(at) = rest.find(words) {
            let before = rest[..at].trim_end();
            let digits: String = before.chars().rev().take_while(char::is_ascii_digit).collect();
            if let Ok(number) = digits.chars().rev().collect::<String>().parse() {
                found.push((relative(&path), number));
            }
            rest = &rest[at + words.len()..];
        }
    }
    found
}

#[test]
fn the_figures_the_documents_state_are_the_codes() {
    let checks = [
        (" fault variants", workloads::faults::FaultKind::ALL.iter().map(|kind| kind.variants().len()).sum::<usize>()),
        (" checkers, among them", checkers::names().len()),
        (" deterministic", conform::case_count() - 1),
        (" cases, all passing", conform::case_count()),
        (" bad inputs that must change nothing", conform::input_count()),
    ];
    let mut wrong = Vec::new();
    for (words, actual) in checks {
        let said = stated(words);
        assert!(!said.is_empty(), "no document states a figure before `{words}`");
        for (file, number) in said.into_iter().filter(|(_, number)| *number != actual) {
            wrong.push(format!("{file}: {number}{words}, the code has {actual}"));
        }
    }
    assert!(wrong.is_empty(), "documents out of date:\n{}", wrong.join("\n"));
}

#[test]
fn the_workspace_keeps_its_architecture_invariants() {
    let root = workspace();
    let mut violations = Vec::new();
    for krate in PURE {
        let manifest = std::fs::read_to_string(root.join(krate).join("Cargo.toml")).unwrap();
        violations.extend(manifest_violations(krate, &manifest));
        let mut files = Vec::new();
        rust_files(&root.join(krate).join("src"), &mut files);
        for file in files {
            violations.extend(pure_source_violations(&relative(&file), &std::fs::read_to_string(&file).unwrap()));
        }
    }
    let mut files = Vec::new();
    for krate in crates() {
        for part in ["src", "benches"] {
            rust_files(&root.join(&krate).join(part), &mut files);
        }
    }
    for file in files.iter().map(|file| relative(file)).filter(|path| path != RUN_FOLDER_OWNER) {
        violations.extend(run_folder_violations(&file, &std::fs::read_to_string(root.join(&file)).unwrap()));
    }
    for file in
        files.iter().map(|file| relative(file)).filter(|path| path.contains("/src/") && path != RUN_COMMAND_WRITER)
    {
        violations.extend(run_command_violations(&file, &std::fs::read_to_string(root.join(&file)).unwrap()));
    }
    for file in
        files.iter().map(|file| relative(file)).filter(|path| path.contains("/src/") && path != CONFIG_EVENT_OWNER)
    {
        violations.extend(config_event_violations(&file, &std::fs::read_to_string(root.join(&file)).unwrap()));
    }
    for krate in crates() {
        rust_files(&root.join(&krate).join("tests"), &mut files);
    }
    assert!(files.len() > 50, "the workspace's Rust files were not found under {}", root.display());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let path = relative(&file);
        violations.extend(module_doc_violation(&path, &text));
        if !path.starts_with("history/") {
            violations.extend(op_literal_violations(&path, &text));
        }
    }
    assert!(violations.is_empty(), "architecture invariants broken:\n{}", violations.join("\n"));
}
