//! No circles inside a module either. Within every folder of `src/` at any depth (`backend/`,
//! `backend/gpu/`, `backend/gpu/ops/linear/`, `web/`, ...) and within the binary's folder
//! (`src/bin/emberlm/`), the files and subfolders form a graph by the paths between them
//! (`crate::backend::gpu::…`, `super::ops::…`, each item of a group); this test fails on every
//! strongly connected part of it with more than one member, naming the members and the paths
//! that join them. The folder's own file (`gpu/mod.rs`, `forward.rs`, `main.rs`), which
//! declares the rest, is not a member.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::layers::{code_without_comments, module_path, rust_files};

/// The items of a `{…}` group (the text after `{`), split at its top-level commas.
fn group_items(group: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                out.push(&group[start..i]);
                return out;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&group[start..]);
    out
}

/// The paths a path's rest names, each cut to its first `want` segments: `a::b::X` → `[a, b]`
/// (for 2), `a::{b::X, c}` → `[a, b]`, `[a, c]`.
fn paths(after: &str, want: usize) -> Vec<Vec<String>> {
    if want == 0 {
        return vec![Vec::new()];
    }
    let after = after.trim_start();
    if let Some(group) = after.strip_prefix('{') {
        return group_items(group)
            .into_iter()
            .flat_map(|item| paths(item, want))
            .collect();
    }
    let ident: String = after
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    if ident.is_empty() || ident == "self" {
        return Vec::new();
    }
    let rest = after[ident.len()..].trim_start();
    match rest.strip_prefix("::") {
        Some(rest) if want > 1 => {
            let tails = paths(rest, want - 1);
            if tails.is_empty() {
                return vec![vec![ident]];
            }
            tails
                .into_iter()
                .map(|t| std::iter::once(ident.clone()).chain(t).collect())
                .collect()
        }
        _ => vec![vec![ident]],
    }
}

/// Every path of `code` from the crate root, cut to `want` segments: `crate::` paths, and
/// `super::` paths resolved from the file's module `path`.
fn absolute_paths(code: &str, path: &[String], want: usize) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for prefix in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(prefix).map(|i| i + from) {
            let before = code[..i].chars().last();
            let standalone = !before
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == ':');
            let mut rest = &code[i + prefix.len()..];
            let mut base: Vec<String> = Vec::new();
            let mut ok = standalone;
            if prefix == "super::" {
                let mut ups = 1;
                while let Some(r) = rest.strip_prefix("super::") {
                    ups += 1;
                    rest = r;
                }
                ok &= ups <= path.len();
                base = path[..path.len().saturating_sub(ups)].to_vec();
            }
            if ok {
                let need = want.saturating_sub(base.len());
                for tail in paths(rest, need.max(1)) {
                    let mut full = base.clone();
                    full.extend(tail);
                    full.truncate(want);
                    out.push(full);
                }
            }
            from = i + prefix.len();
        }
    }
    out
}

/// The strongly connected parts of `edges` with more than one member.
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for m in edges.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    todo.push(m.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        edges.keys().map(|n| (n, reach(n))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for (n, from_n) in &reached {
        let part: BTreeSet<String> = from_n
            .iter()
            .filter(|m| reached.get(m).is_some_and(|r| r.contains(*n)))
            .cloned()
            .collect();
        if part.len() > 1 && !out.contains(&part) {
            out.push(part);
        }
    }
    out
}

/// The graph of one folder: for each member, the members its files' paths reach.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// For each edge of a [`Graph`], a file whose path makes it.
type Examples = BTreeMap<(String, String), String>;

/// The members of `folder`: its files' stems and its subfolders.
fn members(folder: &Path) -> BTreeSet<String> {
    std::fs::read_dir(folder)
        .expect("source folder")
        .filter_map(|e| {
            let p = e.ok()?.path();
            let stem = p.file_stem()?.to_str()?.to_string();
            (p.is_dir() || p.extension().is_some_and(|x| x == "rs")).then_some(stem)
        })
        .filter(|s| s != "mod")
        .collect()
}

/// The graph of every folder module of `src/` (and the binary's folder), by folder.
fn graphs(src: &Path) -> BTreeMap<String, (Graph, Examples)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut out: BTreeMap<String, (Graph, Examples)> = BTreeMap::new();
    let mut known: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let path = module_path(src, file);
        // every folder the file lies in (at any depth): the folder, the path prefix its
        // members are named under, and the file's member; a folder's own file (`gpu/mod.rs`,
        // `forward.rs` beside `forward/`) is none of its members
        let mut places: Vec<(String, Vec<String>, String)> = Vec::new();
        match path.as_slice() {
            [bin, name, member, ..] if bin == "bin" => {
                places.push((format!("bin/{name}"), Vec::new(), member.clone()))
            }
            [top, ..] if top != "bin" => {
                for k in 1..path.len() {
                    places.push((path[..k].join("/"), path[..k].to_vec(), path[k].clone()));
                }
            }
            _ => continue,
        }
        for (folder, prefix, member) in places {
            let names = known
                .entry(folder.clone())
                .or_insert_with(|| members(&src.join(&folder)));
            let text = std::fs::read_to_string(file).expect("source file");
            let code = code_without_comments(&text);
            // a bin file's module path is its own name under the crate root
            let own: Vec<String> = match prefix.is_empty() {
                true => vec![member.clone()],
                false => path.clone(),
            };
            let (graph, examples) = out.entry(folder.clone()).or_default();
            graph.entry(member.clone()).or_default();
            for p in absolute_paths(&code, &own, prefix.len() + 1) {
                let Some(rest) = p.strip_prefix(prefix.as_slice()) else {
                    continue;
                };
                let [to] = rest else { continue };
                if *to != member && names.contains(to) {
                    graph.entry(member.clone()).or_default().insert(to.clone());
                    examples
                        .entry((member.clone(), to.clone()))
                        .or_insert_with(|| file.display().to_string());
                }
            }
        }
    }
    out
}

#[test]
fn no_module_folder_has_a_circle_inside() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for (folder, (graph, examples)) in graphs(&src) {
        for part in circles(&graph) {
            let joins: Vec<String> = part
                .iter()
                .flat_map(|a| part.iter().map(move |b| (a.clone(), b.clone())))
                .filter_map(|k| examples.get(&k).map(|f| format!("{} → {} ({f})", k.0, k.1)))
                .collect();
            found.push(format!("{folder}: {part:?}\n    {}", joins.join("\n    ")));
        }
    }
    assert!(found.is_empty(), "circles:\n{}", found.join("\n"));
}

#[test]
fn the_circle_finder_reads_paths_and_finds_circles() {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        paths("gpu::{ops::attention::X, decode_plan::{A, B}, self}", 2),
        vec![s(&["gpu", "ops"]), s(&["gpu", "decode_plan"])]
    );
    let file = s(&["cpu", "fused"]);
    assert_eq!(
        absolute_paths(
            "use super::quant::{f16_at, Q8Rows};\nx = super::super::web::a;",
            &file,
            2
        ),
        vec![s(&["cpu", "quant"]), s(&["web", "a"])]
    );
    assert_eq!(
        absolute_paths("use crate::gpu::{device::X,\n    ops::Y};", &file, 2),
        vec![s(&["gpu", "device"]), s(&["gpu", "ops"])]
    );
    let mut g: Graph = BTreeMap::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e")] {
        g.entry(a.into()).or_default().insert(b.into());
    }
    let found = circles(&g);
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0],
        ["a", "b", "c"].iter().map(|x| x.to_string()).collect()
    );
}
