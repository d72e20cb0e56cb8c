//! Architecture invariants that a test enforces, so ARCHITECTURE.md cannot drift from the
//! code (as rust-analyzer's `tidy.rs`): the pure crates depend on nothing that reaches the
//! outside world and their sources touch no file system, network, process, clock or
//! runtime; every Rust file opens with a `//!` comment; operation names are written only
//! through `history::Op`, never as string literals compared against an event.

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

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
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

/// An operation compared or built as a string literal (an event's `f` compared with a
/// literal, or `Event::new` given one) outside the `history` crate.
fn op_literal_violations(path: &str, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate().filter(|(_, line)| !line.trim_start().starts_with("//")) {
        let compared = [".f == \"", ".f != \""].iter().any(|p| line.contains(p));
        let built = builds_with_literal_op(line);
        if compared || built {
            found.push(format!("{path}:{}: an operation written as a string literal: {}", number + 1, line.trim()));
        }
    }
    found
}

fn relative(path: &Path) -> String {
    path.strip_prefix(workspace()).unwrap_or(path).display().to_string()
}

#[test]
fn tidy_rules_catch_planted_violations() {
    let manifest = "[package]\nname = \"checkers\"\n[dependencies]\nhistory.workspace = true\ntokio = { workspace = true }\n[dev-dependencies]\ntempfile = \"3\"\n";
    assert_eq!(manifest_violations("checkers", manifest).len(), 1, "tokio is flagged, dev-dependencies are not");
    assert_eq!(pure_source_violations("x.rs", "//! ok\nlet t = std::time::Instant::now();\n").len(), 1);
    assert_eq!(pure_source_violations("x.rs", "//! ok\n// std::fs in a comment is fine\n").len(), 0);
    assert!(module_doc_violation("x.rs", "use std::fmt;\n").is_some());
    assert_eq!(op_literal_violations("x.rs", "if event.f == \"heartbeat\" {").len(), 1);
    assert_eq!(op_literal_violations("x.rs", "Event::new(0, p, EventType::Ok, \"claim\")").len(), 1);
    assert_eq!(op_literal_violations("x.rs", "if event.f == Op::Heartbeat {").len(), 0);
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
    for entry in std::fs::read_dir(&root).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("Cargo.toml").is_file() {
            for part in ["src", "tests", "benches"] {
                rust_files(&dir.join(part), &mut files);
            }
        }
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
