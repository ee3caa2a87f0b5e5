//! A bound linear layer ([`LinearBinding`]): the decode and prefill kernels of every variant
//! built, over one layer's buffers, and which of them a step records.

use super::options::{Epilogue, LinearOptions};
use crate::backend::gpu::counters::AliveBuffers;
use crate::backend::gpu::ops::KernelBinding;
pub use crate::backend::gpu::variants::linear::{LinearChoice, LinearKernel};
use crate::backend::gpu::variants::linear::{LinearVariant, DECODE};
use crate::backend::gpu::variants::Variant;

/// A bound linear layer: both kernels, in every variant built, over the same buffers. Create
/// once, record every step.
#[derive(Debug)]
pub struct LinearBinding {
    /// Per variant, one binding per row part of the weight (one unless it is split).
    pub(super) decode: Vec<(Variant, Vec<KernelBinding>)>,
    pub(super) prefill: Vec<(Variant, Vec<KernelBinding>)>,
    pub(super) rows: u32,
    pub(super) cols: u32,
    pub(super) last_row: bool,
    pub(super) options: LinearOptions,
    pub(super) weight_bytes: u64,
    /// The RoPE frequency table of a Q/K/V layer (the bind groups use it).
    pub(super) _freqs: Option<wgpu::Buffer>,
    pub(super) _alive: AliveBuffers,
}

/// The binding of `variant` in `built`, or the first one when that variant was not built.
fn pick(
    built: &[(Variant, Vec<KernelBinding>)],
    variant: Option<Variant>,
) -> Option<&[KernelBinding]> {
    variant
        .and_then(|v| built.iter().find(|(b, _)| *b == v))
        .or(built.first())
        .map(|(_, k)| k.as_slice())
}

impl LinearBinding {
    /// Records the layer for a step of `n_tokens` tokens (at most `max_tokens`, and the value
    /// the step uniform will hold when the pass runs): the decode kernel for one token, the
    /// prefill kernel for more, each in its first built variant.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.record_variant(pass, n_tokens, LinearKernel::for_tokens(n_tokens), None);
    }

    /// [`Self::record`] in the variants the plan chose.
    pub fn record_planned(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        n_tokens: u32,
        chosen: LinearChoice,
    ) {
        let kernel = LinearKernel::for_tokens(n_tokens);
        let variant = match kernel {
            LinearKernel::Decode => chosen.decode,
            LinearKernel::Prefill => chosen.prefill,
        };
        self.record_variant(pass, n_tokens, kernel, Some(variant));
    }

    /// Records the layer for a batched decode step of `n_tokens` sequences (one token each),
    /// in the decode variant the plan chose, with the kernel its row of the table names
    /// ([`LinearVariant::batched`]). The workgroup shape (GPUs) runs the decode kernel, which
    /// loads each weight part once per group of 4 tokens and keeps each token's one-token
    /// summation order, so a sequence's logits have the same bits as decoding it alone; the
    /// prefill kernel's tiles of 64 rows leave a GPU nearly idle at these token counts (a
    /// SmolLM2 step of 4 sequences took 14.6 ms against 2.2 ms for one on an H200). The rows
    /// shape (CPU-like adapters, bound by arithmetic rather than by reading weights) runs its
    /// multi-token kernel in the same variant.
    pub fn record_batched(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        n_tokens: u32,
        chosen: LinearChoice,
    ) {
        let variant = chosen.decode;
        let kernel =
            LinearVariant::find(DECODE, variant).map_or(LinearKernel::Decode, |v| v.batched);
        self.record_variant(pass, n_tokens, kernel, Some(variant));
    }

    /// Records `kernel` for a step of `n_tokens` tokens, whichever is faster (tests use it to
    /// check both kernels at every token count). Last-row layers always record the decode
    /// kernel.
    pub fn record_kernel(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        n_tokens: u32,
        kernel: LinearKernel,
    ) {
        self.record_variant(pass, n_tokens, kernel, None);
    }

    /// Records `kernel` in `variant` (the first built variant when `None` or not built).
    pub fn record_variant(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        n_tokens: u32,
        kernel: LinearKernel,
        variant: Option<Variant>,
    ) {
        // Last-row layers compute one token: only the decode kernel does that.
        let binding = match kernel {
            LinearKernel::Prefill if !self.last_row => pick(&self.prefill, variant),
            _ => pick(&self.decode, variant),
        };
        for b in binding.unwrap_or_default() {
            b.record(pass, n_tokens);
        }
    }

    /// `(rows, cols)` of the weight matrix.
    pub fn shape(&self) -> (u32, u32) {
        (self.rows, self.cols)
    }

    /// What the layer fuses.
    pub fn options(&self) -> LinearOptions {
        self.options
    }

    /// Bytes of its weight matrix as stored (read once per dispatch).
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    /// A short name of the layer by its fusions, for profiles: `qkv+rope+kv`, `gate_up+swiglu`,
    /// `residual`, `lm_head`, ...
    pub fn kind(&self) -> String {
        let o = self.options;
        let mut parts: Vec<&str> = Vec::new();
        if o.last_row {
            parts.push("lm_head");
        } else if o.kv_write {
            parts.push("qkv");
        }
        if o.norm.is_some() && !o.last_row {
            parts.push("norm");
        }
        if o.rope {
            parts.push("rope");
        }
        if o.kv_write {
            parts.push("kv_write");
        }
        match o.epilogue {
            Epilogue::SwiGlu => parts.push("swiglu"),
            Epilogue::Gelu => parts.push("gelu"),
            Epilogue::GeluErf => parts.push("gelu_erf"),
            Epilogue::GeGlu => parts.push("geglu"),
            Epilogue::None => {}
        }
        if o.accumulate {
            parts.push("residual");
        }
        if parts.is_empty() {
            parts.push("plain");
        }
        parts.join("+")
    }
}
