//! The crate's modules depend on each other without cycles (issue 13): at
//! every depth of the module tree, the graph of "module A names module B"
//! (through `crate::` paths and `super::` paths, outside `#[cfg(test)]`
//! modules) has no cycle. A new edge that closes one fails here, naming the
//! modules on it. The check reads text: a path in a comment or a doc link
//! counts too (a reader of the one module is sent to the other).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file (`src/engine/log/mod.rs` is `engine::log`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("under src").with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The identifiers of a path starting at `at` (`a::b::c` → [a, b, c]).
fn path_at(text: &str, at: usize) -> Vec<String> {
    let rest = &text[at..];
    let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
    rest[..end].split("::").filter(|s| !s.is_empty()).map(str::to_owned).collect()
}

/// The module-level edges of the crate, truncated to `depth` segments.
fn edges(depth: usize) -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in all {
        let module = module_of(&src, &file);
        if module.iter().any(|m| m == "tests") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read");
        let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        let from = module.iter().take(depth).cloned().collect::<Vec<_>>().join("::");
        let mut add = |target: Vec<String>| {
            let to = target.into_iter().take(depth).collect::<Vec<_>>().join("::");
            if !from.is_empty() && !to.is_empty() && to != from {
                graph.entry(from.clone()).or_default().insert(to);
            }
        };
        for (at, _) in text.match_indices("crate::") {
            add(path_at(text, at + "crate::".len()));
        }
        for (at, _) in text.match_indices("super::") {
            if text[..at].ends_with("::") {
                continue; // `super::super::`, counted from the first
            }
            // `super` of module a::b (`a/b.rs` or `a/b/mod.rs`) is `a`.
            let mut base = module.clone();
            base.pop();
            let mut rest = path_at(text, at + "super::".len());
            while rest.first().is_some_and(|s| s == "super") {
                rest.remove(0);
                base.pop();
            }
            base.extend(rest);
            add(base);
        }
    }
    graph
}

/// A cycle of `graph`, if it has one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_owned(), 1);
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next.as_str()) {
                Some(1) => {
                    let start = stack.iter().position(|s| s == next).unwrap_or(0);
                    let mut cycle = stack[start..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(next, graph, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if !state.contains_key(node.as_str())
            && let Some(c) = visit(node, graph, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_module_graph_has_no_cycle_at_any_depth() {
    for depth in 1..=4 {
        let graph = edges(depth);
        assert!(graph.len() > 5, "depth {depth}: the graph was read ({} modules)", graph.len());
        if let Some(cycle) = find_cycle(&graph) {
            panic!("depth {depth}: a module cycle: {}", cycle.join(" -> "));
        }
    }
    // The check sees real edges: the engine's layers point one way.
    let graph = edges(2);
    assert!(graph["engine::log"].contains("engine::commit"), "{:?}", graph["engine::log"]);
    assert!(!graph["engine::commit"].contains("engine::log"), "{:?}", graph["engine::commit"]);
}

#[test]
fn the_check_finds_a_cycle() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    graph.entry("a".into()).or_default().insert("b".into());
    graph.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_cycle(&graph), None);
    graph.entry("c".into()).or_default().insert("a".into());
    assert_eq!(find_cycle(&graph), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
}
