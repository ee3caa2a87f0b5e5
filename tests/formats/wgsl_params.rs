//! The uniform structs the kernels read are written twice, once in WGSL and once in Rust as the
//! `#[repr(C)]` type whose bytes are uploaded. This test reads both and fails when they drift:
//! the same fields in the same order, each the same scalar type, the padding words in the same
//! places. A field added on one side only, two fields swapped or an `f32` read as `u32` would
//! otherwise pass every type check and give the kernel wrong numbers.

use std::path::Path;

/// One 4-byte word of a struct: its field's name (`None` for padding) and scalar type.
#[derive(Debug, Clone, PartialEq)]
struct Word {
    name: Option<String>,
    ty: String,
}

/// The fields of `struct NAME { ... }` in `text` (Rust or WGSL), as `(name, type)`, comments
/// and attributes left out.
fn fields(text: &str, name: &str, file: &str) -> Vec<(String, String)> {
    let start = text
        .find(&format!("struct {name} {{"))
        .unwrap_or_else(|| panic!("{file}: no `struct {name}`"));
    let body = &text[start..];
    let open = body.find('{').unwrap_or(0) + 1;
    let close = body
        .find("\n}")
        .unwrap_or_else(|| panic!("{file}: `struct {name}` not closed"));
    body[open..close]
        .lines()
        .map(|l| l.split("//").next().unwrap_or("").trim())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let l = l.trim_end_matches(',').trim_start_matches("pub ");
            let (n, t) = l
                .split_once(':')
                .unwrap_or_else(|| panic!("{file}: `{l}` in `struct {name}` is not a field"));
            (n.trim().to_string(), t.trim().to_string())
        })
        .collect()
}

/// A field as 4-byte words: `u32`, `f32`, `i32`, Rust arrays `[u32; N]` and WGSL vectors
/// `vecN<u32>`; names starting with `_pad` are padding.
fn words(fields: &[(String, String)], file: &str) -> Vec<Word> {
    let mut out = Vec::new();
    for (name, ty) in fields {
        if let Some(array) = sized_array(ty) {
            // an array of a length named by a constant (the same constant on both sides)
            out.push(Word {
                name: Some(name.clone()),
                ty: array,
            });
            continue;
        }
        let (scalar, n) =
            if let Some(inner) = ty.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
                let (s, n) = inner.split_once(';').unwrap_or((inner, "1"));
                (s.trim().to_string(), n.trim().parse::<usize>().unwrap_or(0))
            } else if let Some(rest) = ty.strip_prefix("vec") {
                let n = rest[..1].parse::<usize>().unwrap_or(0);
                let s = rest[1..].trim_start_matches('<').trim_end_matches('>');
                (s.to_string(), n)
            } else {
                (ty.clone(), 1)
            };
        assert!(
            ["u32", "f32", "i32"].contains(&scalar.as_str()) && n > 0,
            "{file}: field `{name}: {ty}` is not a 4-byte scalar, an array or a vector of them"
        );
        let pad = name.starts_with("_pad");
        for i in 0..n {
            let name = match (pad, n) {
                (true, _) => None,
                (false, 1) => Some(name.clone()),
                (false, _) => Some(format!("{name}[{i}]")),
            };
            out.push(Word {
                name,
                ty: scalar.clone(),
            });
        }
    }
    out
}

/// An array whose length is a named constant, in one spelling for both languages: Rust
/// `[[u32; 4]; N]` and WGSL `array<vec4<u32>, N>` are both `array<vec4<u32>,N>`.
fn sized_array(ty: &str) -> Option<String> {
    let ty: String = ty.chars().filter(|c| !c.is_whitespace()).collect();
    let (element, n) = if let Some(inner) = ty.strip_prefix("array<") {
        inner.strip_suffix('>')?.rsplit_once(',')?
    } else {
        ty.strip_prefix('[')?.strip_suffix(']')?.rsplit_once(';')?
    };
    if n.parse::<usize>().is_ok() {
        return None;
    }
    let element = match element.strip_prefix('[').and_then(|e| e.strip_suffix(']')) {
        Some(inner) => {
            let (scalar, k) = inner.split_once(';')?;
            format!("vec{k}<{scalar}>")
        }
        None => element.to_string(),
    };
    Some(format!("array<{element},{n}>"))
}

fn read(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `rust`'s words equal `wgsl`'s; padding at the end may differ in length (WGSL rounds a
/// uniform struct's size up itself). With `prefix`, the WGSL struct may hold more after the
/// Rust type's words (an array written after it).
fn same_words(rust: &[Word], wgsl: &[Word], prefix: bool) -> Result<(), String> {
    let trim =
        |w: &[Word]| -> usize { w.len() - w.iter().rev().take_while(|w| w.name.is_none()).count() };
    let (r, g) = (trim(rust), trim(wgsl));
    let wgsl_used = if prefix {
        &wgsl[..r.min(wgsl.len())]
    } else {
        &wgsl[..g]
    };
    if &rust[..r] == wgsl_used {
        Ok(())
    } else {
        Err(format!("Rust {:?}\nWGSL {:?}", &rust[..r], wgsl_used))
    }
}

#[test]
fn uniform_structs_match_their_rust_types() {
    // (Rust file, Rust type, WGSL file, WGSL struct, the WGSL struct continues after it)
    let pairs = [
        (
            "src/backend/gpu/ops/embed.rs",
            "EmbedParams",
            "shaders/embed.wgsl",
            "Params",
            false,
        ),
        (
            "src/backend/gpu/ops/linear.rs",
            "LinearParams",
            "shaders/lib/linear_io.wgsl",
            "Params",
            false,
        ),
        (
            "src/backend/gpu/ops/select.rs",
            "SelectParams",
            "shaders/select.wgsl",
            "Params",
            false,
        ),
        (
            "src/backend/gpu/ops/select.rs",
            "RequestUniform",
            "shaders/select.wgsl",
            "Request",
            false,
        ),
        (
            "src/backend/gpu/ops/select.rs",
            "GpuAdjust",
            "shaders/select.wgsl",
            "Adjust",
            false,
        ),
        (
            "src/backend/gpu/ops/kv_store.rs",
            "KvStoreParams",
            "shaders/kv_store.wgsl",
            "Params",
            false,
        ),
        (
            "src/backend/gpu/ops/attention.rs",
            "AttentionParams",
            "shaders/lib/attention_common.wgsl",
            "Params",
            false,
        ),
        (
            "src/backend/gpu/ops/elementwise.rs",
            "ElementwiseParams",
            "shaders/elementwise.wgsl",
            "Params",
            false,
        ),
        (
            "src/backend/gpu/ops/rope.rs",
            "RopeParams",
            "shaders/rope.wgsl",
            "Params",
            false,
        ),
        (
            "src/backend/gpu/ops/row_norm.rs",
            "RowNormParams",
            "shaders/row_norm.wgsl",
            "Params",
            false,
        ),
        (
            "src/backend/gpu/ops/copy.rs",
            "CopyParams",
            "shaders/copy.wgsl",
            "Params",
            false,
        ),
        // the step's head; its rows follow as `array<vec4<u32>, STEP_ROWS>`
        (
            "src/backend/gpu/ops.rs",
            "StepParams",
            "shaders/lib/step.wgsl",
            "Step",
            true,
        ),
    ];
    let mut wrong = Vec::new();
    for (rs, rust_name, wgsl, wgsl_name, prefix) in pairs {
        let rust = words(&fields(&read(rs), rust_name, rs), rs);
        let shader = words(&fields(&read(wgsl), wgsl_name, wgsl), wgsl);
        if let Err(e) = same_words(&rust, &shader, prefix) {
            wrong.push(format!(
                "{rs} `{rust_name}` against {wgsl} `{wgsl_name}`:\n{e}"
            ));
        }
    }
    // one row of the step: (position, first cache row, slot, 0) as a vec4<u32>
    let row = words(
        &fields(
            &read("src/backend/gpu/ops.rs"),
            "StepRow",
            "src/backend/gpu/ops.rs",
        ),
        "ops.rs",
    );
    let types: Vec<&str> = row.iter().map(|w| w.ty.as_str()).collect();
    if types != ["u32"; 4] {
        wrong.push(format!(
            "src/backend/gpu/ops.rs `StepRow` is not four u32 (a vec4<u32>): {types:?}"
        ));
    }
    assert!(
        wrong.is_empty(),
        "uniform structs that drifted:\n{}",
        wrong.join("\n\n")
    );
}

#[test]
fn the_reader_sees_fields_arrays_vectors_and_padding() {
    let rust = "#[repr(C)]\nstruct P {\n    /// doc\n    pub a: u32,\n    b: f32,\n    _pad: [u32; 2],\n}\n";
    let wgsl = "struct Params {\n    a: u32, // note\n    b: f32,\n}\n";
    let r = words(&fields(rust, "P", "p.rs"), "p.rs");
    let w = words(&fields(wgsl, "Params", "p.wgsl"), "p.wgsl");
    assert_eq!(r.len(), 4);
    assert!(same_words(&r, &w, false).is_ok());
    let swapped = "struct Params {\n    b: f32,\n    a: u32,\n}\n";
    let s = words(&fields(swapped, "Params", "p.wgsl"), "p.wgsl");
    assert!(same_words(&r, &s, false).is_err());
    let retyped = "struct Params {\n    a: u32,\n    b: u32,\n}\n";
    let t = words(&fields(retyped, "Params", "p.wgsl"), "p.wgsl");
    assert!(same_words(&r, &t, false).is_err());
    assert_eq!(
        sized_array("[[u32; 4]; N]"),
        sized_array("array<vec4<u32>, N>")
    );
    assert_eq!(sized_array("[u32; 2]"), None);
    let v = words(&[("rows".into(), "vec4<u32>".into())], "v.wgsl");
    assert_eq!(v.len(), 4);
    assert_eq!(v[3].name.as_deref(), Some("rows[3]"));
}
