//! ARCHITECTURE.md's claims that a test can hold, held against the code: every path its
//! codemap names exists; the item an entry for a Rust file names first is defined in that
//! file; every Rust file an entry names exists in that entry's crate or folder; and the
//! dependency paragraph states exactly the edges of tidy's `ALLOWED` table.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::tidy::ALLOWED;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn architecture() -> String {
    std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).unwrap()
}

/// A codemap entry: the path it is about and its whole text (continuation lines included).
struct Entry {
    path: String,
    text: String,
    line: usize,
}

/// The codemap's entries: lines "- `PATH` — …" and the indented lines that continue them.
fn entries(text: &str) -> Vec<Entry> {
    let mut found: Vec<Entry> = Vec::new();
    let mut open = false;
    for (number, line) in text.lines().enumerate() {
        let head = line.strip_prefix("- `").and_then(|rest| rest.split_once('`'));
        match head {
            Some((path, rest)) if rest.starts_with(" — ") => {
                found.push(Entry { path: path.to_string(), text: rest.to_string(), line: number + 1 });
                open = true;
            }
            _ if open && line.starts_with("  ") => {
                found.last_mut().unwrap().text.push_str(&format!(" {}", line.trim()))
            }
            _ => open = false,
        }
    }
    found
}

/// The words between backticks in `text`, in order.
fn quoted(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

fn is_identifier(word: &str) -> bool {
    let mut chars = word.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `source` defines `name`: as an item, or as a variant list a declaring macro
/// expands to an enum (`Source { … }` in `words!`).
fn defines(source: &str, name: &str) -> bool {
    let items = ["struct", "enum", "trait", "type", "fn", "const", "static", "mod", "macro_rules!"];
    source.lines().any(|line| {
        let words: Vec<&str> = line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '!')).collect();
        let item = words.windows(2).any(|pair| items.contains(&pair[0]) && pair[1] == name);
        let declared = line.trim_start().strip_prefix(name).is_some_and(|rest| rest.trim() == "{");
        item || declared
    })
}

/// Every Rust file under `dir`, as paths relative to it.
fn rust_files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(next) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&next) else { continue };
        for entry in read.flatten() {
            let path = entry.path();
            if path.file_name().is_some_and(|name| name == "target" || name == "node_modules" || name == ".venv") {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                found.push(path.strip_prefix(dir).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    found
}

/// What is false in the codemap of `text`, read against the workspace at `root`.
fn codemap_violations(root: &Path, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in entries(text) {
        let at = format!("ARCHITECTURE.md:{} (`{}`)", entry.line, entry.path);
        let path = root.join(&entry.path);
        if !path.exists() {
            found.push(format!("{at}: no such path"));
            continue;
        }
        let words = quoted(&entry.text);
        // "- `file.rs` — `Item` …": the item the entry opens with.
        if entry.path.ends_with(".rs") && entry.text.starts_with(" — `") {
            let first = words.first().map(|word| word.trim_end_matches("()"));
            if let Some(name) = first.filter(|word| is_identifier(word)) {
                let source = std::fs::read_to_string(&path).unwrap_or_default();
                if !defines(&source, name) {
                    found.push(format!("{at}: `{name}` is not defined there"));
                }
            }
        }
        // The Rust files an entry names live in its crate (its first folder), or under it.
        let scope = if path.is_dir() { path.clone() } else { root.join(entry.path.split('/').next().unwrap()) };
        let files = rust_files(&scope);
        for named in words.iter().filter(|word| word.ends_with(".rs") && !word.contains(' ')) {
            if root.join(named).is_file() {
                continue;
            }
            let named = named.trim_start_matches("src/");
            let here = files.iter().any(|file| file == named || file.ends_with(&format!("/{named}")));
            if !here {
                found.push(format!("{at}: names `{named}`, which is not under {}", scope.display()));
            }
        }
    }
    found
}

/// The edges "`a` → `b`, `c`" the dependency paragraph states (what follows "never" in a
/// clause is an edge denied, not stated).
fn stated_edges(text: &str) -> BTreeSet<(String, String)> {
    let crates: Vec<&str> = ALLOWED.iter().map(|(name, _)| *name).collect();
    let start = text.find("Dependency direction").expect("ARCHITECTURE.md has the dependency paragraph");
    let paragraph = text[start..].split("\n\n").next().unwrap();
    let mut edges = BTreeSet::new();
    for clause in paragraph.split(';') {
        let clause = clause.split(" never ").next().unwrap().split(". ").next().unwrap();
        let sides: Vec<Vec<&str>> = clause
            .split('→')
            .map(|side| quoted(side).into_iter().filter(|word| crates.contains(word)).collect())
            .collect();
        for pair in sides.windows(2) {
            for from in &pair[0] {
                for to in &pair[1] {
                    edges.insert((from.to_string(), to.to_string()));
                }
            }
        }
    }
    edges
}

fn allowed_edges() -> BTreeSet<(String, String)> {
    ALLOWED.iter().flat_map(|(from, tos)| tos.iter().map(move |to| (from.to_string(), to.to_string()))).collect()
}

#[test]
fn the_codemap_names_what_exists_where_it_says() {
    let found = codemap_violations(&workspace(), &architecture());
    assert!(found.is_empty(), "ARCHITECTURE.md's codemap is false:\n{}", found.join("\n"));
}

#[test]
fn the_dependency_paragraph_states_exactly_the_allowed_edges() {
    let stated = stated_edges(&architecture());
    let allowed = allowed_edges();
    let unstated: Vec<_> = allowed.difference(&stated).collect();
    let unallowed: Vec<_> = stated.difference(&allowed).collect();
    assert!(
        unstated.is_empty() && unallowed.is_empty(),
        "ARCHITECTURE.md's dependency paragraph and tidy's ALLOWED differ: allowed, not stated {unstated:?}; stated, not allowed {unallowed:?}"
    );
}

/// The checks themselves find what they are for: a moved item, a missing file, a missing
/// path, an edge left out or added.
#[test]
fn the_architecture_checks_find_false_claims() {
    let root = workspace();
    let moved = "- `history/src/sources.rs` — `Source` (the sources)\n";
    assert_eq!(codemap_violations(&root, moved).len(), 1, "Source is declared in vocab.rs");
    let right = "- `history/src/vocab.rs` — `Source` (the sources)\n";
    assert!(codemap_violations(&root, right).is_empty(), "{:?}", codemap_violations(&root, right));
    let gone = "- `history/src/nowhere.rs` — `Source`\n";
    assert_eq!(codemap_violations(&root, gone).len(), 1);
    let file = "- `protocol/` — the contract: `wire.rs`, `body.rs`,\n  and `nothing_here.rs`.\n";
    assert_eq!(codemap_violations(&root, file).len(), 1, "nothing_here.rs is not in protocol/");
    let edges = stated_edges(
        "Dependency direction: `lab` → `protocol` → `history`; `conform` → `system`, never `engine`; `checkers` → `history`. Nothing depends on `harness`.\n\nNext.",
    );
    let expected: BTreeSet<(String, String)> =
        [("lab", "protocol"), ("protocol", "history"), ("conform", "system"), ("checkers", "history")]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
    assert_eq!(edges, expected);
}
