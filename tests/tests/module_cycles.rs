//! No module cycles beyond a service/future pair (ARCHITECTURE.md, rule 5).
//!
//! Reads each library crate's `src/`, takes its top-level modules and the
//! `crate::` paths each names in code outside its `#[cfg(test)]` part, and
//! finds the cycles among them. Comments and doc links are left out: a doc
//! that points a reader to a related item elsewhere is not a dependency of
//! the code. A crate listed in `KNOWN` may keep the cycles listed for it,
//! and no others; the list only shrinks.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Cycles that were there when the rule was written, per crate, each as its
/// sorted modules. Issue #33 (item 6) removed the last of them
/// (tower-breaker's); the list only shrinks, so it stays empty.
const KNOWN: &[(&str, &[&[&str]])] = &[];

/// The one cycle every layer may have: a service and its response future.
const ALLOWED: &[&str] = &["future", "service"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// The library crates: `tower-*` and `http-body-replay`, as the workspace's
/// members globs them.
fn crates() -> Vec<PathBuf> {
    let mut crates: Vec<PathBuf> = fs::read_dir(workspace())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            let name = path.file_name().unwrap().to_string_lossy();
            (name.starts_with("tower-") || name == "http-body-replay")
                && path.join("src/lib.rs").exists()
        })
        .collect();
    crates.sort();
    crates
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().unwrap() != "bin" {
                rust_files(&path, files);
            }
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

/// Each top-level module and the top-level modules it names.
fn edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let top = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let top = top.trim_end_matches(".rs").to_owned();
        if top == "lib" {
            continue;
        }
        let text = fs::read_to_string(&file).unwrap();
        let text = text.split("\n#[cfg(test)]").next().unwrap();
        let text: String = text
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let named = names.entry(top).or_default();
        for (i, _) in text.match_indices("crate::") {
            let rest = &text[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // `use crate::{a::X, b::{Y, Z}}`: the first segment of each
                // top-level item of the group.
                let mut depth = 0;
                let mut item_start = true;
                for (j, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => item_start = true,
                        c if item_start && (c.is_alphanumeric() || c == '_') => {
                            named.insert(identifier(&group[j..]));
                            item_start = false;
                        }
                        _ => {}
                    }
                }
            } else {
                named.insert(identifier(rest));
            }
        }
    }
    let modules: BTreeSet<String> = names.keys().cloned().collect();
    names
        .into_iter()
        .map(|(module, named)| {
            let named = named
                .into_iter()
                .filter(|name| *name != module && modules.contains(name))
                .collect();
            (module, named)
        })
        .collect()
}

fn identifier(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The strongly connected components of more than one module (Tarjan).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: BTreeSet<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, module: &'a str) {
            let n = self.index.len();
            self.index.insert(module, n);
            self.low.insert(module, n);
            self.stack.push(module);
            for next in &self.edges[module] {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[module].min(self.low[next]);
                    self.low.insert(module, low);
                } else if self.stack.contains(&next) {
                    let low = self.low[module].min(self.index[next]);
                    self.low.insert(module, low);
                }
            }
            if self.low[module] == self.index[module] {
                let mut component = Vec::new();
                loop {
                    let top = self.stack.pop().unwrap();
                    component.push(top.to_owned());
                    if top == module {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.insert(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: BTreeSet::new(),
    };
    for module in edges.keys() {
        if !walk.index.contains_key(module.as_str()) {
            walk.visit(module);
        }
    }
    walk.found
}

#[test]
fn no_module_cycles_beyond_a_service_and_its_future() {
    let mut problems = Vec::new();
    for krate in crates() {
        let name = krate.file_name().unwrap().to_string_lossy().into_owned();
        let known: BTreeSet<Vec<String>> = KNOWN
            .iter()
            .filter(|(known, _)| *known == name)
            .flat_map(|(_, cycles)| cycles.iter())
            .map(|cycle| cycle.iter().map(|m| m.to_string()).collect())
            .collect();
        let found = cycles(&edges(&krate.join("src")));
        for cycle in &found {
            if cycle != ALLOWED && !known.contains(cycle) {
                problems.push(format!("{name}: new cycle {}", cycle.join(" → ")));
            }
        }
        for cycle in known.difference(&found) {
            problems.push(format!(
                "{name}: the cycle {} is gone or changed; update KNOWN in {}",
                cycle.join(" → "),
                file!()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_reader_finds_a_planted_cycle() {
    let edges = BTreeMap::from([
        ("a".to_owned(), BTreeSet::from(["b".to_owned()])),
        ("b".to_owned(), BTreeSet::from(["c".to_owned()])),
        ("c".to_owned(), BTreeSet::from(["a".to_owned()])),
        ("d".to_owned(), BTreeSet::from(["a".to_owned()])),
    ]);
    let found = cycles(&edges);
    assert_eq!(
        found,
        BTreeSet::from([vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]])
    );
}
