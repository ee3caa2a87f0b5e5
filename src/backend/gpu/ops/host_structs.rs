//! Every struct the host uploads for a kernel held to the WGSL struct it mirrors, as naga lays
//! that out (names, offsets, sizes, scalar types), and every WGSL struct claimed by a Rust one
//! (the structs are declared through [`crate::backend::gpu::host_struct`]).

use crate::backend::gpu::host_struct::{Field, HostStruct};
use crate::backend::gpu::ops;
use wgpu::naga;

/// A WGSL struct and the fields the host writes for it.
struct Mirror {
    /// File under `shaders/`.
    file: &'static str,
    /// The struct's name there.
    wgsl: &'static str,
    /// The host's fields, and the bytes it uploads for one.
    fields: Vec<Field>,
    size: usize,
    /// `const NAME = value;` lines the struct's array lengths need (values the host passes
    /// as defines).
    defines: Vec<(&'static str, String)>,
}

fn of<T: HostStruct>(file: &'static str, wgsl: &'static str) -> Mirror {
    Mirror {
        file,
        wgsl,
        fields: T::FIELDS.to_vec(),
        size: std::mem::size_of::<T>(),
        defines: Vec::new(),
    }
}

/// Every WGSL struct the host writes, with its Rust twin.
fn mirrors() -> Vec<Mirror> {
    use ops::{attention, copy, elementwise, embed, kv_store, linear, rope, row_norm, select};
    let mut rope = of::<rope::RopeParams>("rope.wgsl", "Params");
    rope.defines
        .push(("FREQ_VEC4S", format!("{}u", rope::FREQ_VEC4S)));
    // the step uniform is the step's header followed by its rows
    let mut step = of::<ops::StepParams>("lib/step.wgsl", "Step");
    step.fields.push(Field {
        name: "rows",
        offset: std::mem::size_of::<ops::StepParams>(),
        size: ops::STEP_ROWS * std::mem::size_of::<ops::StepRow>(),
        ty: "[StepRow; STEP_ROWS]",
    });
    step.size += ops::STEP_ROWS * std::mem::size_of::<ops::StepRow>();
    vec![
        of::<linear::LinearParams>("lib/linear_io.wgsl", "Params"),
        of::<attention::AttentionParams>("lib/attention_common.wgsl", "Params"),
        of::<copy::CopyParams>("copy.wgsl", "Params"),
        of::<elementwise::ElementwiseParams>("elementwise.wgsl", "Params"),
        of::<embed::EmbedParams>("embed.wgsl", "Params"),
        of::<kv_store::KvStoreParams>("kv_store.wgsl", "Params"),
        of::<row_norm::RowNormParams>("row_norm.wgsl", "Params"),
        of::<select::SelectParams>("select.wgsl", "Params"),
        of::<select::RequestUniform>("select.wgsl", "Request"),
        of::<select::GpuAdjust>("select.wgsl", "Adjust"),
        rope,
        step,
    ]
}

/// WGSL structs no host bytes fill (a kernel's own values).
const SHADER_ONLY: &[(&str, &str)] = &[("lib/quant.wgsl", "Q8"), ("lib/quant.wgsl", "QPart")];

fn source(file: &str) -> String {
    let path = format!("{}/shaders/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The names of the structs `text` declares at the top level.
fn struct_names(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("struct "))
        .filter_map(|rest| {
            rest.split(|c: char| !c.is_alphanumeric() && c != '_')
                .next()
        })
        .map(str::to_string)
        .collect()
}

/// A module of `file`'s top-level one-line `const`s, the given defines and its struct
/// `name` alone: what naga needs to lay the struct out, without the kernel's other defines.
fn struct_module(m: &Mirror) -> String {
    let text = source(m.file);
    let mut out = String::new();
    for (name, value) in &m.defines {
        out.push_str(&format!("const {name} = {value};\n"));
    }
    for line in text.lines() {
        if line.starts_with("const ") && line.trim_end().ends_with(';') {
            out.push_str(line);
            out.push('\n');
        }
    }
    let start = text
        .find(&format!("\nstruct {} {{", m.wgsl))
        .unwrap_or_else(|| panic!("{}: no struct {}", m.file, m.wgsl));
    let body = &text[start..];
    let end = body.find("\n}").expect("the struct ends") + 2;
    assert!(
        !body[..end].contains('#'),
        "{}: struct {} holds a preprocessor line",
        m.file,
        m.wgsl
    );
    out.push_str(&body[..end]);
    out.push('\n');
    out
}

/// The WGSL struct's members as host fields would describe them (scalar types named as
/// Rust names them, other types by size alone) and its size.
fn wgsl_layout(m: &Mirror) -> (Vec<Field>, usize) {
    let module = naga::front::wgsl::parse_str(&struct_module(m))
        .unwrap_or_else(|e| panic!("{}: struct {}: {e}", m.file, m.wgsl));
    let ty = module
        .types
        .iter()
        .find(|(_, t)| t.name.as_deref() == Some(m.wgsl))
        .map(|(_, t)| t)
        .expect("the struct is in the module");
    let naga::TypeInner::Struct { members, span } = &ty.inner else {
        panic!("{} is not a struct", m.wgsl);
    };
    let gctx = module.to_ctx();
    let fields = members
        .iter()
        .map(|member| {
            let inner = &module.types[member.ty].inner;
            let ty = match inner {
                naga::TypeInner::Scalar(s) => match (s.kind, s.width) {
                    (naga::ScalarKind::Uint, 4) => "u32",
                    (naga::ScalarKind::Sint, 4) => "i32",
                    (naga::ScalarKind::Float, 4) => "f32",
                    _ => "other scalar",
                },
                _ => "compound",
            };
            Field {
                name: Box::leak(member.name.clone().unwrap_or_default().into_boxed_str()),
                offset: member.offset as usize,
                size: inner.size(gctx) as usize,
                ty,
            }
        })
        .collect();
    (fields, *span as usize)
}

fn named(fields: &[Field]) -> Vec<Field> {
    fields
        .iter()
        .copied()
        .filter(|f| !f.name.starts_with('_'))
        .collect()
}

/// What differs between `m`'s host fields and its WGSL struct (empty: one layout).
fn differences(m: &Mirror) -> Vec<String> {
    let (wgsl, span) = wgsl_layout(m);
    let (host, shader) = (named(&m.fields), named(&wgsl));
    let what = format!("{} `{}`", m.file, m.wgsl);
    let names = |f: &[Field]| f.iter().map(|f| f.name).collect::<Vec<_>>();
    let mut found = Vec::new();
    if names(&host) != names(&shader) {
        found.push(format!(
            "{what}: fields {:?} on the host, {:?} in WGSL",
            names(&host),
            names(&shader)
        ));
        return found;
    }
    for (h, s) in host.iter().zip(&shader) {
        if (h.offset, h.size) != (s.offset, s.size) {
            found.push(format!(
                "{what}: `{}` at (offset, size) {:?} on the host, {:?} in WGSL",
                h.name,
                (h.offset, h.size),
                (s.offset, s.size)
            ));
        }
        if s.ty != "compound" && h.ty != s.ty {
            found.push(format!(
                "{what}: `{}` is {} on the host, {} in WGSL",
                h.name, h.ty, s.ty
            ));
        }
    }
    // the host's bytes cover the struct, adding at most the tail padding a uniform's
    // 16-byte rounding asks for
    if m.size < span || m.size >= span + 16 {
        found.push(format!(
            "{what}: {} bytes on the host, {span} in WGSL",
            m.size
        ));
    }
    found
}

#[test]
fn every_host_struct_has_its_kernels_layout() {
    let found: Vec<String> = mirrors().iter().flat_map(differences).collect();
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn every_wgsl_struct_is_mirrored_or_the_shaders_own() {
    let claimed: Vec<(String, String)> = mirrors()
        .iter()
        .map(|m| (m.file.to_string(), m.wgsl.to_string()))
        .chain(
            SHADER_ONLY
                .iter()
                .map(|(f, s)| (f.to_string(), s.to_string())),
        )
        .collect();
    let dir = format!("{}/shaders", env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for sub in ["", "lib/"] {
        for entry in std::fs::read_dir(format!("{dir}/{sub}")).expect("shaders/ is readable") {
            let name = entry.expect("a directory entry").file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".wgsl") {
                files.push(format!("{sub}{name}"));
            }
        }
    }
    assert!(files.len() > 10, "the shaders were found");
    for file in files {
        for name in struct_names(&source(&file)) {
            assert!(
                claimed.contains(&(file.clone(), name.clone())),
                "{file}: struct {name} has no host twin in host_struct's mirrors and is not \
                 listed as the shader's own"
            );
        }
    }
}

#[test]
fn a_changed_field_is_caught() {
    // the check itself: a field retyped, two swapped, one moved and a struct shortened,
    // each found
    let base = || of::<ops::row_norm::RowNormParams>("row_norm.wgsl", "Params");
    assert_eq!(differences(&base()), Vec::<String>::new());
    let mut m = base();
    m.fields[3].ty = "u32";
    assert!(differences(&m)[0].contains("`eps` is u32 on the host, f32 in WGSL"));
    let mut m = base();
    m.fields.swap(0, 1);
    assert!(differences(&m)[0].contains("fields"));
    let mut m = base();
    m.fields[1].offset += 4;
    assert!(differences(&m)[0].contains("`rows` at (offset, size) (8, 4) on the host"));
    let mut m = base();
    m.size = 12;
    assert!(differences(&m)[0].contains("12 bytes on the host, 16 in WGSL"));
}
