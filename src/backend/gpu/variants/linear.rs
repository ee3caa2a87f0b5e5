//! The linear family's variants, as data: for the decode kernel and the prefill kernel, each
//! shape's name, the define that selects its body in `shaders/linear.wgsl`, its geometry (the
//! shader reads the same numbers as defines, `WG_SIZE`, `ROWS` and `TOKENS`, so host and
//! shader cannot disagree) and how a batched decode step runs in it.
//! [`crate::backend::gpu::ops::Linear`] builds and dispatches from these rows alone; the plan
//! ([`crate::backend::gpu::plan`]) times and chooses among them.

use super::{AdapterKind, Variant, VariantSpec};

/// Which of the two linear kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearKernel {
    /// Matrix × vector, for one token (correct for more, reading the weights once per token).
    Decode,
    /// Tiled matrix × matrix, for several tokens (correct for one).
    Prefill,
}

impl LinearKernel {
    /// The kernel a step of `n_tokens` tokens records.
    pub fn for_tokens(n_tokens: u32) -> Self {
        if n_tokens <= 1 {
            LinearKernel::Decode
        } else {
            LinearKernel::Prefill
        }
    }
}

/// The variants a step records a linear layer in: the plan's choices for the decode and the
/// prefill kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearChoice {
    /// The decode kernel's variant (also what a batched decode step runs in).
    pub decode: Variant,
    /// The prefill kernel's variant.
    pub prefill: Variant,
}

/// How many invocations a workgroup has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invocations {
    /// The largest power of two up to this that the device allows.
    UpTo(u32),
    /// Exactly this many; the build fails naming the limit where the device allows fewer.
    Exactly(u32),
}

/// Whose rows [`LinearVariant::rows`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowsOf {
    /// A workgroup computes `rows` rows (per pass of the decode kernel, per tile of prefill).
    Workgroup,
    /// Each invocation computes `rows` rows: a workgroup computes invocations × rows.
    Invocation,
}

/// One shape of a linear kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearVariant {
    /// Name, define, and the adapters it is guessed for.
    pub spec: VariantSpec,
    /// Invocations of a workgroup (the define `WG_SIZE`).
    pub invocations: Invocations,
    /// Output rows (the define `ROWS`), of a workgroup or of an invocation.
    pub rows: u32,
    /// Whose rows `rows` counts.
    pub rows_of: RowsOf,
    /// Tokens a workgroup's tile spans (the define `TOKENS`; 1: the kernel walks every token).
    pub tokens: u32,
    /// Workgroup memory the kernel declares, in bytes (checked against the device's limit).
    pub shared_bytes: u32,
    /// Whether it reduces across its workgroup (and so takes the reduction's defines).
    pub reduces: bool,
    /// Under a KV write of block kinds: whether the workgroups past the query rows take one
    /// cache block each (the decode workgroup shape); otherwise a workgroup's rows must be
    /// whole blocks.
    pub block_groups: bool,
    /// The kernel a batched decode step records when this decode variant is chosen.
    pub batched: LinearKernel,
}

/// Shared memory of the workgroup prefill tile: the weight and activation tiles (8 KiB +
/// 4 KiB) and the norm statistics (1 KiB + 256 B).
const PREFILL_SHARED_BYTES: u32 = 8192 + 4096 + 1024 + 256;

/// The decode kernel's variants, the first the default of builds that ask for none.
pub const DECODE: &[LinearVariant] = &[
    LinearVariant {
        spec: VariantSpec {
            variant: Variant::WORKGROUP,
            define: None,
            guessed_for: AdapterKind::Gpu,
            summary: "a workgroup per 4 rows, reduced through shared memory or subgroups",
        },
        // rows are short in small models (576 columns = 72 parts of 8), so a bigger
        // workgroup would leave most invocations idle; 64 is two warps, one wave on AMD
        invocations: Invocations::UpTo(64),
        rows: 4,
        rows_of: RowsOf::Workgroup,
        tokens: 1,
        shared_bytes: 0,
        reduces: true,
        block_groups: true,
        batched: LinearKernel::Decode,
    },
    LinearVariant {
        spec: VariantSpec {
            variant: Variant::ROWS,
            define: Some("ROWS_SHAPE"),
            guessed_for: AdapterKind::Cpu,
            summary: "each invocation owns 4 whole rows; no barriers",
        },
        // one subgroup on lavapipe (8 lanes), two on SwiftShader (4): the barrier-free shape
        // gains nothing from more
        invocations: Invocations::UpTo(8),
        rows: 4,
        rows_of: RowsOf::Invocation,
        tokens: 1,
        shared_bytes: 0,
        reduces: false,
        block_groups: false,
        // decodes each part once per 4 tokens without the per-token reductions (lavapipe:
        // the decode kernel gave a batch of 8 no gain over one)
        batched: LinearKernel::Prefill,
    },
];

/// The prefill kernel's variants, the first the default of builds that ask for none.
pub const PREFILL: &[LinearVariant] = &[
    LinearVariant {
        spec: VariantSpec {
            variant: Variant::WORKGROUP,
            define: None,
            guessed_for: AdapterKind::Gpu,
            summary: "64 × 32 tiles of rows × tokens through shared memory",
        },
        invocations: Invocations::Exactly(256),
        rows: 64,
        rows_of: RowsOf::Workgroup,
        tokens: 32,
        shared_bytes: PREFILL_SHARED_BYTES,
        reduces: false,
        block_groups: false,
        batched: LinearKernel::Prefill,
    },
    LinearVariant {
        spec: VariantSpec {
            variant: Variant::ROWS,
            define: Some("ROWS_SHAPE"),
            guessed_for: AdapterKind::Cpu,
            summary: "each invocation owns 4 rows × 4 tokens; no shared tile",
        },
        invocations: Invocations::UpTo(8),
        rows: 4,
        rows_of: RowsOf::Invocation,
        tokens: 4,
        shared_bytes: 0,
        reduces: false,
        block_groups: false,
        batched: LinearKernel::Prefill,
    },
];

impl LinearVariant {
    /// The row of `variant` in `table`.
    pub fn find(table: &'static [LinearVariant], variant: Variant) -> Option<&'static Self> {
        super::find(table, |v| &v.spec, variant)
    }

    /// Output rows one workgroup computes with `invocations` invocations.
    pub fn rows_per_group(&self, invocations: u32) -> u32 {
        match self.rows_of {
            RowsOf::Workgroup => self.rows,
            RowsOf::Invocation => self.rows * invocations,
        }
    }
}
