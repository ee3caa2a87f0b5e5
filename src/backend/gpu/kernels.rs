//! WGSL sources, a tiny preprocessor, and the compute-pipeline cache.
//!
//! Kernels live in `shaders/*.wgsl` (one family per file) and are compiled into the binary with
//! `include_str!`. The preprocessor knows four things: `#include "file"` (a helper from
//! `shaders/lib/` shared between families, such as the workgroup reduction, weight decoding or
//! the RoPE angle, written once), `#ifdef NAME` / `#ifndef NAME`, `#else` and
//! `#endif`. Defines with a value also become WGSL `const` declarations, placed after the
//! `enable` directives (which WGSL requires first). Pipelines are cached by
//! (shader file, entry point, defines) and built once per context.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use super::device::GpuContext;
use crate::error::{Error, Result};

/// A WGSL source file compiled into the crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShaderFile {
    /// File name under `shaders/`.
    pub name: &'static str,
    /// Its text.
    pub source: &'static str,
}

macro_rules! shader_file {
    ($name:literal) => {
        ShaderFile {
            name: $name,
            source: include_str!(concat!("../../../shaders/", $name)),
        }
    };
}

/// A helper under `shaders/lib/`, named without the folder by `#include`.
macro_rules! lib_file {
    ($name:literal) => {
        ShaderFile {
            name: $name,
            source: include_str!(concat!("../../../shaders/lib/", $name)),
        }
    };
}

/// RoPE fused with the KV-cache write.
pub const ROPE: ShaderFile = shader_file!("rope.wgsl");
/// The KV-cache write for caches of kinds other than f32 (encode on the way in).
pub const KV_STORE: ShaderFile = shader_file!("kv_store.wgsl");
/// Grouped-query attention over the KV cache (causal or bidirectional), in every variant.
pub const ATTENTION: ShaderFile = shader_file!("attention.wgsl");
/// The merge of split attention's partials (flash-decoding).
pub const ATTENTION_MERGE: ShaderFile = shader_file!("attention_merge.wgsl");
/// The elementwise SwiGLU gate (separate gate and up projections).
pub const ELEMENTWISE: ShaderFile = shader_file!("elementwise.wgsl");
/// RMS norms of whole rows outside a linear (QK-norm, post-norms).
pub const ROW_NORM: ShaderFile = shader_file!("row_norm.wgsl");
/// Linear layers with weights in their stored type (decode and prefill), in every variant.
pub const LINEAR: ShaderFile = shader_file!("linear.wgsl");
/// Buffer copy (bandwidth measurement).
pub const COPY: ShaderFile = shader_file!("copy.wgsl");
/// Dequantizing embedding lookups.
pub const EMBED: ShaderFile = shader_file!("embed.wgsl");
/// Candidate selection for sampling (top-k of the adjusted logits, sums).
pub const SELECT: ShaderFile = shader_file!("select.wgsl");

/// The helpers of `shaders/lib/` that kernels may `#include`: the workgroup reduction, weight
/// decoding, the activation functions, the RoPE angle, the linear kernels' inputs and
/// epilogues, what the attention kernels share, the step uniform and the KV-cache kinds'
/// reading and encoding.
const INCLUDES: &[ShaderFile] = &[
    lib_file!("reduce.wgsl"),
    lib_file!("quant.wgsl"),
    lib_file!("activation.wgsl"),
    lib_file!("rope_angle.wgsl"),
    lib_file!("linear_io.wgsl"),
    lib_file!("attention_common.wgsl"),
    lib_file!("step.wgsl"),
    lib_file!("kv_kind.wgsl"),
    lib_file!("kv_encode.wgsl"),
    lib_file!("kv_read.wgsl"),
];

/// Deepest `#include` nesting accepted (guards against include cycles).
const MAX_INCLUDE_DEPTH: usize = 8;

/// Preprocessor defines: a name alone (a flag for `#ifdef`) or a name with a WGSL expression,
/// which also becomes `const NAME = value;`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Defines(BTreeMap<String, Option<String>>);

impl Defines {
    /// No defines.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a flag that `#ifdef NAME` sees.
    pub fn flag(mut self, name: &str) -> Self {
        self.0.insert(name.to_string(), None);
        self
    }

    /// Adds a flag only when `on`.
    pub fn flag_if(self, name: &str, on: bool) -> Self {
        if on {
            self.flag(name)
        } else {
            self
        }
    }

    /// Adds `const NAME = value;` (value is WGSL, e.g. `256u`); `#ifdef NAME` sees it too.
    pub fn value(mut self, name: &str, value: impl std::fmt::Display) -> Self {
        self.0.insert(name.to_string(), Some(value.to_string()));
        self
    }

    /// [`Defines::value`] when `value` is given, nothing otherwise.
    pub fn value_if(self, name: &str, value: Option<impl std::fmt::Display>) -> Self {
        match value {
            Some(v) => self.value(name, v),
            None => self,
        }
    }

    /// These defines with `other`'s added (a name in both takes `other`'s value).
    pub fn merged(mut self, other: Defines) -> Self {
        self.0.extend(other.0);
        self
    }

    /// Whether `name` is defined.
    pub fn is_defined(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }
}

/// One open `#ifdef`: whether its branch is live, and whether its parent was.
struct Cond {
    parent_live: bool,
    taken: bool,
    in_else: bool,
}

fn expand(
    file: &ShaderFile,
    defines: &Defines,
    depth: usize,
    directives: &mut Vec<String>,
    body: &mut String,
) -> std::result::Result<(), String> {
    if depth > MAX_INCLUDE_DEPTH {
        return Err(format!("#include nested deeper than {MAX_INCLUDE_DEPTH}"));
    }
    let mut stack: Vec<Cond> = Vec::new();
    let live = |stack: &[Cond]| stack.last().is_none_or(|c| c.parent_live && c.taken);
    for (n, line) in file.source.lines().enumerate() {
        let at = || format!("{}:{}", file.name, n + 1);
        let trimmed = line.trim();
        if let Some(rest) = trimmed.strip_prefix('#') {
            let mut words = rest.split_whitespace();
            let directive = words.next().unwrap_or("");
            let arg = words.next();
            match (directive, arg) {
                ("ifdef" | "ifndef", Some(name)) => {
                    let defined = defines.is_defined(name);
                    stack.push(Cond {
                        parent_live: live(&stack),
                        taken: defined == (directive == "ifdef"),
                        in_else: false,
                    });
                }
                ("else", None) => match stack.last_mut() {
                    Some(c) if !c.in_else => {
                        c.in_else = true;
                        c.taken = !c.taken;
                    }
                    _ => return Err(format!("{}: #else without #ifdef", at())),
                },
                ("endif", None) => {
                    if stack.pop().is_none() {
                        return Err(format!("{}: #endif without #ifdef", at()));
                    }
                }
                ("include", Some(quoted)) => {
                    if live(&stack) {
                        let name = quoted.trim_matches('"');
                        let inc = INCLUDES
                            .iter()
                            .find(|f| f.name == name)
                            .ok_or_else(|| format!("{}: unknown include `{name}`", at()))?;
                        expand(inc, defines, depth + 1, directives, body)?;
                    }
                }
                _ => return Err(format!("{}: unknown directive `{trimmed}`", at())),
            }
            continue;
        }
        if !live(&stack) {
            continue;
        }
        if trimmed.starts_with("enable ") || trimmed.starts_with("requires ") {
            if !directives.iter().any(|d| d == trimmed) {
                directives.push(trimmed.to_string());
            }
        } else {
            body.push_str(line);
            body.push('\n');
        }
    }
    if stack.is_empty() {
        Ok(())
    } else {
        Err(format!("{}: #ifdef without #endif", file.name))
    }
}

/// Expands `file` under `defines` into WGSL ready for the compiler.
pub fn preprocess(file: &ShaderFile, defines: &Defines) -> std::result::Result<String, String> {
    let mut directives = Vec::new();
    let mut body = String::new();
    expand(file, defines, 0, &mut directives, &mut body)?;
    let mut out = String::new();
    for d in &directives {
        out.push_str(d);
        out.push('\n');
    }
    for (name, value) in &defines.0 {
        if let Some(value) = value {
            out.push_str(&format!("const {name} = {value};\n"));
        }
    }
    out.push_str(&body);
    Ok(out)
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct KernelKey {
    file: &'static str,
    entry: &'static str,
    defines: Defines,
}

/// Compute pipelines built so far, keyed by (shader file, entry point, defines).
#[derive(Debug, Default)]
pub struct KernelCache {
    pipelines: Mutex<HashMap<KernelKey, Arc<wgpu::ComputePipeline>>>,
}

impl KernelCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of pipelines built.
    pub fn len(&self) -> usize {
        self.pipelines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no pipeline has been built yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pipeline for `entry` in `file` under `defines`, built on first use.
    ///
    /// Compile and link errors come back as [`Error::Shader`] with the compiler's message.
    pub async fn pipeline(
        &self,
        ctx: &GpuContext,
        file: &ShaderFile,
        entry: &'static str,
        defines: &Defines,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        let key = KernelKey {
            file: file.name,
            entry,
            defines: defines.clone(),
        };
        if let Some(p) = self
            .pipelines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return Ok(Arc::clone(p));
        }
        let shader_error = |message: String| Error::Shader {
            file: file.name.to_string(),
            entry: entry.to_string(),
            message,
        };
        let source = preprocess(file, defines).map_err(shader_error)?;
        ctx.check()?;
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let label = format!("{}:{entry}", file.name);
        let module = ctx
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&label),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
        let pipeline = ctx
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&label),
                layout: None,
                module: &module,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions::default(),
                cache: None,
            });
        if let Some(err) = scope.pop().await {
            return Err(shader_error(err.to_string()));
        }
        ctx.counter_cells().pipeline();
        let pipeline = Arc::new(pipeline);
        self.pipelines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, Arc::clone(&pipeline));
        Ok(pipeline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: ShaderFile = ShaderFile {
        name: "sample.wgsl",
        source: "#ifdef A\nenable f16;\n#endif\nfn f() {}\n#ifndef A\nlet no_a = 1;\n#else\nlet yes_a = 1;\n#endif\n#include \"reduce.wgsl\"\n",
    };

    #[test]
    fn branches_follow_defines() {
        let with = preprocess(&SAMPLE, &Defines::new().flag("A")).unwrap();
        assert!(with.starts_with("enable f16;\n"), "{with}");
        assert!(with.contains("yes_a") && !with.contains("no_a"));
        let without = preprocess(&SAMPLE, &Defines::new()).unwrap();
        assert!(!without.contains("enable f16") && without.contains("no_a"));
        assert!(without.contains("fn workgroup_sum"), "include expanded");
    }

    #[test]
    fn values_become_consts_after_directives() {
        let out = preprocess(&SAMPLE, &Defines::new().flag("A").value("WG_SIZE", "64u")).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "enable f16;");
        assert_eq!(lines[1], "const WG_SIZE = 64u;");
    }

    #[test]
    fn malformed_sources_are_rejected_with_location() {
        for (src, needle) in [
            ("#ifdef A\n", "without #endif"),
            ("#endif\n", "sample.wgsl:1: #endif without"),
            ("#else\n", "#else without"),
            ("#ifdef A\n#else\n#else\n#endif\n", "sample.wgsl:3"),
            ("#include \"nope.wgsl\"\n", "unknown include `nope.wgsl`"),
            ("#pragma x\n", "unknown directive"),
        ] {
            let f = ShaderFile {
                name: "sample.wgsl",
                source: src,
            };
            let err = preprocess(&f, &Defines::new()).unwrap_err();
            assert!(err.contains(needle), "{src:?}: {err}");
        }
    }

    #[test]
    fn nested_conditions_inside_dead_branch_stay_dead() {
        let f = ShaderFile {
            name: "n.wgsl",
            source: "#ifdef A\n#ifndef B\nx\n#endif\n#endif\ny\n",
        };
        assert_eq!(preprocess(&f, &Defines::new()).unwrap(), "y\n");
        assert_eq!(preprocess(&f, &Defines::new().flag("A")).unwrap(), "x\ny\n");
    }

    #[test]
    fn every_shipped_shader_preprocesses_both_ways() {
        for file in [
            ROPE,
            ATTENTION,
            ATTENTION_MERGE,
            ELEMENTWISE,
            ROW_NORM,
            COPY,
            SELECT,
            KV_STORE,
        ] {
            for d in [
                Defines::new().value("WG_SIZE", "256u"),
                Defines::new()
                    .value("WG_SIZE", "256u")
                    .flag("SUBGROUPS")
                    .flag("HAS_BIAS")
                    .flag("ROTATE_HALF")
                    .flag("KV_VEC4"),
                Defines::new().value("WG_SIZE", "64u").flag("NO_ROPE"),
                Defines::new()
                    .value("WG_SIZE", "64u")
                    .flag("KV_KINDS")
                    .flag("KV_DEFER")
                    .value("K_KIND", "2u")
                    .value("V_KIND", "4u"),
            ] {
                // every variant's body (the rows shape is a define)
                for d in [d.clone(), d.flag("ROWS_SHAPE")] {
                    preprocess(&file, &d).unwrap_or_else(|e| panic!("{}: {e}", file.name));
                }
            }
        }
        // The weight kernels, once per stored type: each type brings exactly one decoder.
        const WEIGHTS: [&str; 11] = [
            "WEIGHT_F32",
            "WEIGHT_F16",
            "WEIGHT_BF16",
            "WEIGHT_Q8_0",
            "WEIGHT_Q4_0",
            "WEIGHT_Q4_1",
            "WEIGHT_Q5_0",
            "WEIGHT_Q5_1",
            "WEIGHT_Q4_K",
            "WEIGHT_Q5_K",
            "WEIGHT_Q6_K",
        ];
        let shapes = [
            Defines::new(),
            Defines::new().flag("ROWS_SHAPE"),
            Defines::new().flag("PREFILL"),
            Defines::new().flag("ROWS_SHAPE").flag("PREFILL"),
        ];
        for (file, shape) in shapes
            .iter()
            .map(|s| (LINEAR, s))
            .chain([(EMBED, &shapes[0])])
        {
            for weight in WEIGHTS {
                for d in [
                    Defines::new().value("WG_SIZE", "64u").flag(weight),
                    Defines::new()
                        .value("WG_SIZE", "64u")
                        .flag(weight)
                        .flag("SUBGROUPS")
                        .flag("HAS_BIAS")
                        .flag("ACCUMULATE")
                        .flag("X_VEC4")
                        .flag("FROM_IDS"),
                ] {
                    let out = preprocess(&file, &d.merged(shape.clone())).unwrap();
                    let defs = |f: &str| out.lines().filter(|l| l.starts_with(f)).count();
                    assert_eq!(defs("fn q_load("), 1, "{weight}");
                    assert_eq!(defs("fn q_dequant("), 1, "{weight}");
                }
            }
        }
    }
}
