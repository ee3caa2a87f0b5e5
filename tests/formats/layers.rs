//! The crate's layers point one way. Every top-level module of `src/` has a layer; a module may
//! use modules of lower layers only (and itself). This test reads every source file and fails on
//! a `crate::` path that reaches sideways or up, naming the file, the line and the rule.
//!
//! The layers, bottom first:
//!
//! | layer | modules | what they are |
//! |---|---|---|
//! | 0 | `error`, `math` | the crate's error type; transcendental functions with the same bits on every target |
//! | 1 | `dtype`, `config`, `candidates`, `tune` | leaves: storage types and dequantization, model configuration, the selection wire format, per-device choices |
//! | 2 | `model` | host tensors and weights, the CPU reference |
//! | 3 | `gpu`, `cpu`, `format`, `sampling` | device and kernels; the CPU backend's kernels; file formats; CPU sampling |
//! | 4 | `tokenizer` | text ↔ ids |
//! | 5 | `chat`, `constrain` | chat templates; response formats and the token mask of each step |
//! | 6 | `loader`, `forward` | a model opened from files; the GPU forward pass (graph, per-architecture builders) |
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
    ("gpu", 3),
    ("cpu", 3),
    ("format", 3),
    ("sampling", 3),
    ("store", 3),
    ("tokenizer", 4),
    ("chat", 5),
    ("constrain", 5),
    ("loader", 6),
    ("forward", 6),
    ("session", 7),
    ("engine", 8),
    ("openai", 9),
    ("web", 10),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
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

/// The top-level module a file of `src/` belongs to (`src/gpu/ops/linear.rs` → `gpu`), or
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

/// Every module named by a `crate::X` path in `code`.
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        let after = &rest[i + "crate::".len()..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // `$crate::` and identifiers ending in `crate` are not paths into this crate.
        let standalone = !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
        if standalone && !name.is_empty() {
            out.push(name);
        }
        rest = after;
    }
    out
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
        for (n, line) in text.lines().enumerate() {
            for used in crate_paths(code_of(line)) {
                if used == module {
                    continue;
                }
                // Names re-exported at the crate root (`crate::Error`, `crate::Result`) are
                // `error`'s.
                let target = match used.as_str() {
                    "Error" | "Result" => "error",
                    other => other,
                };
                let Some(&theirs) = layers.get(target) else {
                    wrong.push(format!(
                        "{}:{}: `crate::{used}` is not a module with a layer",
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
    assert_eq!(code_of("    /// see [`crate::session::Session`]"), "");
    assert_eq!(code_of("use crate::gpu; // crate::web"), "use crate::gpu; ");
}
