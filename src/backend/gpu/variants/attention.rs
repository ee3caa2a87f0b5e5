//! The attention family's variants, as data: each shape's name, the define that selects its
//! body in `shaders/attention.wgsl`, its geometry, the heads it can run (when it applies) and
//! how many keys one invocation may walk. [`crate::backend::gpu::ops::Attention`] builds and binds from these
//! rows alone; the plan ([`crate::backend::gpu::plan`]) times and chooses among them.

use super::{AdapterKind, Variant, VariantSpec};
use crate::backend::gpu::key_split::SHADER_LOOP_BUDGET;

/// Largest head dimension RoPE and attention accept (their per-head tables and shared arrays
/// are sized for it; real models use 64 to 256).
pub const MAX_HEAD_DIM: u32 = 256;

/// How a workgroup's invocations divide a step's heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadsOf {
    /// A workgroup per (query head, token); its invocations share the keys of a tile.
    Workgroup,
    /// An invocation per (query head, token); a workgroup takes neighbouring heads.
    Invocation,
}

/// One shape of the attention kernel.
#[derive(Debug, Clone, Copy)]
pub struct AttentionVariant {
    /// Name, define, and the adapters it is guessed for.
    pub spec: VariantSpec,
    /// Most invocations of a workgroup (`WG_SIZE`): the largest power of two up to this the
    /// device allows.
    pub invocations: u32,
    /// Whether it reduces across its workgroup (and so takes the reduction's defines).
    pub reduces: bool,
    /// How its invocations divide the heads.
    pub heads_of: HeadsOf,
    /// The largest head it runs (also bounded by the workgroup where an invocation owns an
    /// output dimension: [`HeadsOf::Workgroup`]).
    pub max_head_dim: u32,
    /// Whether it is compiled for one head size (`HEAD_QUADS`, so that its loops over a head
    /// have a constant trip count).
    pub per_head_dim: bool,
    /// The most keys one invocation may walk for heads of `head_dim` with workgroups of
    /// `invocations` (see [`SHADER_LOOP_BUDGET`]).
    pub key_limit: fn(head_dim: u32, invocations: u32) -> u32,
}

/// Every attention variant, the first the default of builds that ask for none.
pub const ALL: &[AttentionVariant] = &[
    AttentionVariant {
        spec: VariantSpec {
            variant: Variant::WORKGROUP,
            define: None,
            guessed_for: AdapterKind::Gpu,
            summary: "a workgroup per head and token, keys in tiles of the workgroup",
        },
        invocations: 256,
        reduces: true,
        heads_of: HeadsOf::Workgroup,
        max_head_dim: MAX_HEAD_DIM,
        per_head_dim: false,
        key_limit: workgroup_key_limit,
    },
    AttentionVariant {
        spec: VariantSpec {
            variant: Variant::ROWS,
            define: Some("ROWS_SHAPE"),
            guessed_for: AdapterKind::Cpu,
            summary: "an invocation per head and token; no barriers",
        },
        // one subgroup on lavapipe, one on SwiftShader (4 lanes); small models have few
        // heads, so a bigger group would leave most invocations idle
        invocations: 4,
        reduces: false,
        heads_of: HeadsOf::Invocation,
        // its per-head loops must stay short enough for shader compilers to unroll them
        max_head_dim: 128,
        per_head_dim: true,
        key_limit: rows_key_limit,
    },
];

impl AttentionVariant {
    /// The row of `variant`, if attention has it.
    pub fn find(variant: Variant) -> Option<&'static Self> {
        super::find(ALL, |v| &v.spec, variant)
    }

    /// Whether it runs heads of `head_dim` (before the workgroup's own bound).
    pub fn applies(&self, head_dim: u32) -> bool {
        head_dim <= self.max_head_dim
    }
}

/// The smallest key limit of every attention variant for heads of `head_dim` (workgroups of
/// 64 where they matter): what a buffer shared by whichever variant runs must hold.
pub fn any_variant_key_limit(head_dim: u32) -> u32 {
    ALL.iter()
        .map(|v| (v.key_limit)(head_dim, v.invocations.min(64)))
        .min()
        .unwrap_or(1)
}

/// The head's vec4 quads and the loop iterations each costs (without vec4 reads, a head not
/// a multiple of 4, each quad is an inner loop of 4), and the budget left after the setup
/// loops.
fn head_loops(head_dim: u32) -> (u32, u32, u32) {
    let hd = head_dim.max(1);
    let per_quad = if hd.is_multiple_of(4) { 1 } else { 5 };
    (
        hd.div_ceil(4),
        per_quad,
        SHADER_LOOP_BUDGET.saturating_sub(2 * hd),
    )
}

/// The rows shape: per key, the score's and the values' loops over the head, the rescale's,
/// the key loop itself.
fn rows_key_limit(head_dim: u32, _invocations: u32) -> u32 {
    let (quads, per_quad, budget) = head_loops(head_dim);
    (budget / (2 * quads * per_quad + quads + 1)).max(1)
}

/// The workgroup shape: per tile of `invocations` keys, the score's loop over the head, the
/// values' loop over the tile's keys of an invocation's group, the reductions' loops (a tree
/// or the subgroups' slots).
fn workgroup_key_limit(head_dim: u32, invocations: u32) -> u32 {
    let (quads, per_quad, budget) = head_loops(head_dim);
    let tile = invocations.max(1);
    let groups = (tile / head_dim.max(1)).max(1);
    let per_tile = quads * per_quad + tile.div_ceil(groups) + 2 * 32 + 1;
    (budget / per_tile).saturating_mul(tile).max(1)
}
