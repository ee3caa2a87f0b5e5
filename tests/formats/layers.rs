//! The crate's layers point one way. Every top-level module of `src/` has a layer; a module may
//! use modules of lower layers only (and itself). This test reads every source file and fails on
//! a path that reaches sideways or up, naming the file, the line and the rule: a `crate::` path,
//! each item of a `crate::{a::X, b::Y}` group (over several lines too), and a `super::` path
//! that climbs out of its top-level module. The crate root (`lib.rs`, which declares the
//! modules) and the binaries (`bin/`, above every layer) are not checked.
//!
//! The layers, bottom first:
//!
//! | layer | modules | what they are |
//! |---|---|---|
//! | 0 | `error`, `math`, `option_keys` | the crate's error type; transcendental functions with the same bits on every target; the spellings of option keys |
//! | 1 | `dtype`, `config`, `candidates`, `tune` | leaves: storage types and dequantization, model configuration, the selection wire format, per-device choices |
//! | 2 | `model` | host tensors and weights, the architectures and their graph, the CPU reference |
//! | 3 | `format`, `sampling`, `store` | file formats; CPU sampling; downloads kept in the page's storage |
//! | 4 | `tokenizer`, `backend` | text ↔ ids; the `Backend` trait and its GPU and CPU implementations (device, kernels, the forward pass over the model's graph) |
//! | 5 | `chat`, `constrain` | chat templates; response formats and the token mask of each step |
//! | 6 | `loader` | a model opened from files |
//! | 7 | `session` | one conversation: options, context, decode, beam search |
//! | 8 | `engine` | queue, cancellation, device-loss recovery |
//! | 9 | `openai` | OpenAI-style requests and responses over the engine |
//! | 10 | `web` | JavaScript ↔ Rust conversion (wasm32 only) |

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Layer of each top-level module of `src/`.
const LAYERS: &[(&str, u32)] = &[
    ("error", 0),
    ("math", 0),
    ("option_keys", 0),
    ("dtype", 1),
    ("config", 1),
    ("candidates", 1),
    ("tune", 1),
    ("model", 2),
    ("format", 3),
    ("sampling", 3),
    ("store", 3),
    ("tokenizer", 4),
    ("backend", 4),
    ("chat", 5),
    ("constrain", 5),
    ("loader", 6),
    ("session", 7),
    ("engine", 8),
    ("openai", 9),
    ("web", 10),
];

pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`src/backend/gpu/ops/linear.rs` → `backend`), or
/// `None` for the crate root and the binaries.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    if first == "lib.rs" || first == "bin" {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_string())
}

/// The code of a line, without a trailing `//` comment (doc links are not dependencies).
fn code_of(line: &str) -> &str {
    let trimmed = line.trim_start();
    if trimmed.starts_with("//") {
        return "";
    }
    match line.find("//") {
        // `//` inside a string literal (a URL) is rare enough in `use` lines; cut anyway.
        Some(i) => &line[..i],
        None => line,
    }
}

/// The identifiers at the start of a path's rest: `gpu::x` → `gpu`; a group `{a::X, b::{Y}}`
/// → `a`, `b` (nested groups belong to their item's first segment).
fn first_segments(after: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let Some(group) = after.trim_start().strip_prefix('{') else {
        let name = ident(after);
        return if name.is_empty() { vec![] } else { vec![name] };
    };
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut item_start = 0usize;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                out.push(ident(&group[item_start..i]));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(ident(&group[item_start..i]));
                item_start = i + 1;
            }
            _ => {}
        }
    }
    out.retain(|n| !n.is_empty() && n != "self");
    out
}

/// Every module named by a `crate::X` path (or a `crate::{X, Y}` group) in `code`, with the
/// byte offset where the path starts.
fn crate_paths_at(code: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = code[from..].find("crate::").map(|i| i + from) {
        let before = code[..i].chars().last();
        let after = &code[i + "crate::".len()..];
        // `$crate::` and identifiers ending in `crate` are not paths into this crate.
        let standalone = !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
        if standalone {
            out.extend(first_segments(after).into_iter().map(|n| (i, n)));
        }
        from = i + "crate::".len();
    }
    out
}

/// Every module named by a `crate::` path in `code`.
fn crate_paths(code: &str) -> Vec<String> {
    crate_paths_at(code).into_iter().map(|(_, n)| n).collect()
}

/// The module path of a file of `src/` (`src/backend/gpu/ops/linear.rs` → `backend::gpu::ops::linear`,
/// `src/backend/mod.rs` → `backend`).
pub(crate) fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap_or(file);
    let mut parts: Vec<String> = rel
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .map(|s| s.trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// Every top-level module a `super::` path in `code` reaches by climbing out of the file's
/// module `path` to the crate root (`super::super::engine` from `session::beam`), with the
/// byte offset where the path starts. Paths that stay inside a top-level module are its own
/// business.
fn super_paths_at(code: &str, path: &[String]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = code[from..].find("super::").map(|i| i + from) {
        let before = code[..i].chars().last();
        let standalone = !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
        let mut rest = &code[i..];
        let mut ups = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            ups += 1;
            rest = r;
        }
        if standalone && ups >= path.len() {
            // an inline module (`mod tests`) is one level deeper than its file: a name that
            // is no top-level module is an item of the file's own module
            let top = first_segments(rest)
                .into_iter()
                .filter(|n| LAYERS.iter().any(|(m, _)| m == n));
            out.extend(top.map(|n| (i, n)));
        }
        from = i + ups * "super::".len();
    }
    out
}

/// `text` without its comments, one entry per line (doc links are not dependencies), joined
/// with newlines so that a `use` spread over several lines reads as one.
pub(crate) fn code_without_comments(text: &str) -> String {
    text.lines().map(code_of).collect::<Vec<_>>().join("\n")
}

#[test]
fn every_top_level_module_has_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let layers: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&src).expect("src/") {
        let path = entry.expect("entry").path();
        if let Some(module) = module_of(&src, &path) {
            if !layers.contains_key(module.as_str()) {
                missing.push(module);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "modules without a layer in tests/formats/layers.rs: {missing:?}"
    );
}

#[test]
fn modules_use_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let layers: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let Some(&own) = layers.get(module.as_str()) else {
            continue; // reported by `every_top_level_module_has_a_layer`
        };
        let text = std::fs::read_to_string(file).expect("source file");
        let code = code_without_comments(&text);
        let path = module_path(&src, file);
        let mut used_at = crate_paths_at(&code);
        used_at.extend(super_paths_at(&code, &path));
        for (at, used) in used_at {
            if used == module {
                continue;
            }
            let n = code[..at].matches('\n').count();
            let line = text.lines().nth(n).unwrap_or_default();
            // Names re-exported at the crate root (`crate::Error`, `crate::Result`) are
            // `error`'s.
            let target = match used.as_str() {
                "Error" | "Result" => "error",
                other => other,
            };
            let Some(&theirs) = layers.get(target) else {
                wrong.push(format!(
                    "{}:{}: `{used}` is not a module with a layer",
                    file.display(),
                    n + 1
                ));
                continue;
            };
            if theirs >= own {
                wrong.push(format!(
                    "{}:{}: `{module}` (layer {own}) uses `{target}` (layer {theirs}): {}",
                    file.display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that run sideways or up:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_checker_sees_paths_and_skips_comments() {
    assert_eq!(
        crate_paths("use crate::gpu::{A, B}; let x = crate::model::f();"),
        vec!["gpu", "model"]
    );
    assert!(crate_paths("$crate::x::y").is_empty());
    assert_eq!(
        crate_paths("use crate::{\n    gpu::{A, B},\n    Error, model::x::{self, Y},\n};"),
        vec!["gpu", "Error", "model"]
    );
    let beam: Vec<String> = vec!["session".into(), "beam".into()];
    let reached = |code: &str| -> Vec<String> {
        super_paths_at(code, &beam)
            .into_iter()
            .map(|(_, n)| n)
            .collect()
    };
    assert_eq!(reached("use super::super::engine::Engine;"), vec!["engine"]);
    assert_eq!(
        reached("use super::super::{web::X, backend};"),
        vec!["web", "backend"]
    );
    assert!(reached("use super::decode::Running; use super::*;").is_empty());
    assert_eq!(code_of("    /// see [`crate::session::Session`]"), "");
    assert_eq!(code_of("use crate::gpu; // crate::web"), "use crate::gpu; ");
}

/// The rows of the layer table in this file's doc comment: `(layer, modules)`.
fn documented_layers() -> Vec<(u32, Vec<String>)> {
    include_str!("layers.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("//! | "))
        .filter_map(|row| {
            let mut cells = row.split(" | ");
            let layer = cells.next()?.trim().parse::<u32>().ok()?;
            let modules = cells
                .next()?
                .split(',')
                .map(|m| m.trim().trim_matches('`').to_string())
                .collect();
            Some((layer, modules))
        })
        .collect()
}

/// The table in the doc comment above is `LAYERS`, and docs/ARCHITECTURE.md shows the same
/// table, row for row.
#[test]
fn the_layer_table_is_the_documented_one() {
    let mut documented: Vec<(String, u32)> = documented_layers()
        .into_iter()
        .flat_map(|(layer, modules)| modules.into_iter().map(move |m| (m, layer)))
        .collect();
    documented.sort();
    let mut table: Vec<(String, u32)> = LAYERS.iter().map(|&(m, l)| (m.to_string(), l)).collect();
    table.sort();
    assert_eq!(
        documented, table,
        "the doc comment's table differs from LAYERS"
    );
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ARCHITECTURE.md");
    let doc = std::fs::read_to_string(&doc_path)
        .unwrap_or_else(|e| panic!("{}: {e}", doc_path.display()));
    for row in include_str!("layers.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("//! |"))
    {
        let row = format!("|{row}");
        assert!(
            doc.lines().any(|l| l == row),
            "docs/ARCHITECTURE.md lacks the layer table's row\n{row}"
        );
    }
}
