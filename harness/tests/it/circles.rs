//! No circle between the files of a crate: a file that names another's items through
//! `crate::`, `super::` or `self::` paths depends on it, and no file depends, through any
//! chain, on a file that depends on it — except a module's own files naming their parent
//! (`super::`), which is how a module shares its types with its parts. Tests (`#[cfg(test)]`
//! to the end of a file) are left out: a test may use what it likes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A file of a crate's `src`, by module path (`lib.rs` is the empty path).
type Module = Vec<String>;

fn module_of(src: &Path, file: &Path) -> Module {
    let relative = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = relative.iter().map(|part| part.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    parts
}

/// The text before its tests, without `//` comments.
fn code(text: &str) -> String {
    let before_tests = text.split("#[cfg(test)]").next().unwrap_or_default();
    before_tests
        .lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths a use tree starting at `text` names, each as segments; `text` starts right
/// after a `crate::`, `super::` or `self::`.
fn use_tree(text: &str) -> Vec<Vec<String>> {
    let mut segments = Vec::new();
    let mut rest = text;
    loop {
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if name.is_empty() {
            break;
        }
        rest = &rest[name.len()..];
        segments.push(name);
        match rest.strip_prefix("::") {
            Some(after) => rest = after,
            None => return vec![segments],
        }
    }
    let Some(group) = rest.strip_prefix('{') else { return vec![segments] };
    let mut paths = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                paths.extend(branch(&segments, &group[start..at]));
                return paths;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                paths.extend(branch(&segments, &group[start..at]));
                start = at + 1;
            }
            _ => {}
        }
    }
    paths
}

fn branch(prefix: &[String], item: &str) -> Vec<Vec<String>> {
    use_tree(item.trim_start()).into_iter().map(|tail| prefix.iter().cloned().chain(tail).collect()).collect()
}

/// The modules `file`'s code names, as absolute module paths (not yet resolved to files).
fn named(module: &Module, code: &str) -> Vec<Module> {
    let mut found = Vec::new();
    for (anchor, base) in [("crate::", Some(Vec::new())), ("super::", None), ("self::", None)] {
        for (at, _) in code.match_indices(anchor) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            // The module a file's `self` is: itself; its `super`: the parent of a file module,
            // the parent's parent of nothing (a `mod.rs` is its directory's module).
            let base = match (anchor, &base) {
                (_, Some(root)) => root.clone(),
                ("self::", None) => module.clone(),
                _ => {
                    let mut parent = module.clone();
                    parent.pop();
                    parent
                }
            };
            for tail in use_tree(&code[at + anchor.len()..]) {
                found.push(base.iter().cloned().chain(tail).collect());
            }
        }
    }
    found
}

/// The file a module path names: its longest prefix that is a file of the crate.
fn resolve(files: &BTreeMap<Module, PathBuf>, path: &Module) -> Option<Module> {
    (0..=path.len()).rev().map(|len| path[..len].to_vec()).find(|prefix| files.contains_key(prefix))
}

/// Every circle among `files` (a module path → its file's code): the strongly connected
/// groups of more than one file, each sorted.
fn circles(files: &BTreeMap<Module, String>) -> Vec<Vec<Module>> {
    let edges = edges(files);
    let graph: BTreeMap<Module, BTreeSet<Module>> =
        edges.iter().map(|(from, targets)| (from.clone(), targets.keys().cloned().collect())).collect();
    strongly_connected(&graph).into_iter().filter(|group| group.len() > 1).collect()
}

/// Which files each file depends on, each with the first path that names it.
fn edges(files: &BTreeMap<Module, String>) -> BTreeMap<Module, BTreeMap<Module, String>> {
    let known: BTreeMap<Module, PathBuf> = files.keys().map(|module| (module.clone(), PathBuf::new())).collect();
    let mut edges: BTreeMap<Module, BTreeMap<Module, String>> = BTreeMap::new();
    for (module, text) in files {
        let targets = edges.entry(module.clone()).or_default();
        for path in named(module, &code(text)) {
            let Some(target) = resolve(&known, &path) else { continue };
            // A module's part naming its parent (or any ancestor) is not a dependency.
            if target == *module || module.starts_with(&target) {
                continue;
            }
            targets.entry(target).or_insert_with(|| path.join("::"));
        }
    }
    edges
}

/// Tarjan's strongly connected components, iteratively small: the graphs are a crate's files.
fn strongly_connected(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct State<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<Module, usize>,
        low: BTreeMap<Module, usize>,
        stack: Vec<Module>,
        on_stack: BTreeSet<Module>,
        groups: Vec<Vec<Module>>,
    }
    fn visit(state: &mut State, node: &Module) {
        let next = state.index.len();
        state.index.insert(node.clone(), next);
        state.low.insert(node.clone(), next);
        state.stack.push(node.clone());
        state.on_stack.insert(node.clone());
        for target in state.edges.get(node).cloned().unwrap_or_default() {
            if !state.index.contains_key(&target) {
                visit(state, &target);
                let low = state.low[node].min(state.low[&target]);
                state.low.insert(node.clone(), low);
            } else if state.on_stack.contains(&target) {
                let low = state.low[node].min(state.index[&target]);
                state.low.insert(node.clone(), low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut group = Vec::new();
            while let Some(top) = state.stack.pop() {
                state.on_stack.remove(&top);
                let done = top == *node;
                group.push(top);
                if done {
                    break;
                }
            }
            group.sort();
            state.groups.push(group);
        }
    }
    let mut state = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        groups: Vec::new(),
    };
    for node in edges.keys() {
        if !state.index.contains_key(node) {
            visit(&mut state, node);
        }
    }
    state.groups
}

fn show(krate: &str, group: &[Module]) -> String {
    let names: Vec<String> = group.iter().map(|module| format!("{krate}::{}", module.join("::"))).collect();
    names.join(" ↔ ")
}

fn files_of(krate: &str) -> BTreeMap<Module, String> {
    let src = super::tidy::workspace().join(krate).join("src");
    let mut paths = Vec::new();
    super::tidy::rust_files(&src, &mut paths);
    paths
        .into_iter()
        .filter(|path| path.file_name().is_some_and(|name| name != "main.rs"))
        .map(|path| (module_of(&src, &path), std::fs::read_to_string(&path).unwrap()))
        .collect()
}

#[test]
fn no_crate_has_a_circle_between_its_files() {
    let mut found = Vec::new();
    for (krate, _) in super::tidy::ALLOWED {
        let files = files_of(krate);
        let edges = edges(&files);
        for group in circles(&files) {
            found.push(show(krate, &group));
            for from in &group {
                for (to, path) in edges[from].iter().filter(|(to, _)| group.contains(to)) {
                    found.push(format!("    {} → {} (`{path}`)", from.join("::"), to.join("::")));
                }
            }
        }
    }
    assert!(found.is_empty(), "files that depend on each other, through any chain:\n{}", found.join("\n"));
}

#[test]
fn circles_are_found_through_use_groups_super_and_chains() {
    let files = |pairs: &[(&str, &str)]| -> BTreeMap<Module, String> {
        pairs
            .iter()
            .map(|(module, text)| {
                let path = if module.is_empty() { vec![] } else { module.split("::").map(String::from).collect() };
                (path, text.to_string())
            })
            .collect()
    };
    let names = |found: Vec<Vec<Module>>| -> Vec<String> { found.iter().map(|group| show("c", group)).collect() };
    // A chain through a use group: a → b::c → a.
    let chain = files(&[
        ("", "mod a; mod b;"),
        ("a", "use crate::b::{c::Thing, Other};"),
        ("b", ""),
        ("b::c", "fn f() { crate::a::g() }"),
    ]);
    assert_eq!(names(circles(&chain)), ["c::a ↔ c::b::c"]);
    // Siblings through `super::`: b::c → b::d → b::c.
    let siblings = files(&[("b", "mod c; mod d;"), ("b::c", "use super::d::X;"), ("b::d", "use super::{c::Y};")]);
    assert_eq!(names(circles(&siblings)), ["c::b::c ↔ c::b::d"]);
    // A part naming its parent, the parent naming the part, a test, a comment: no circle.
    let fine = files(&[
        ("b", "mod c; pub use self::c::X; pub struct Shared;"),
        ("b::c", "use super::Shared; // crate::a::x\n#[cfg(test)]\nmod tests { use crate::a::Y; }"),
        ("a", "use crate::b::c::X;"),
    ]);
    assert!(circles(&fine).is_empty(), "{:?}", names(circles(&fine)));
}
