//! The KV cache: K and V for every layer, in their kinds ([`KvKinds`]: f32, f16, q8_0, q4_0,
//! nf4), allocated once for the chosen context length.

use crate::config::ModelConfig;
use crate::dtype::kv::KvKinds;
use crate::error::{Error, Result};

use super::counters::AliveBuffers;
use super::device::GpuContext;

/// Per layer, a K and a V buffer of `slots · context` rows of `kv_dim` values each, a row
/// stored in [`crate::dtype::kv::KvKind::row_words`] u32 words of its kind
/// (`[slots · context, kv_dim]` f32 for f32). Each slot holds one sequence of up to `context`
/// positions (slot `s`'s position `p` is row `s · context + p`); slot 0 is the main sequence,
/// whose fill mark [`KvCache::pos`] tracks, and the others serve batched decoding. Positions
/// advance as tokens are processed; nothing is ever re-uploaded.
#[derive(Debug)]
pub struct KvCache {
    /// K per layer, `[slots · context, row words of kinds.k]`.
    pub k: Vec<wgpu::Buffer>,
    /// V per layer, `[slots · context, row words of kinds.v]`.
    pub v: Vec<wgpu::Buffer>,
    context: usize,
    slots: usize,
    kv_dim: usize,
    kinds: KvKinds,
    pos: usize,
    _alive: AliveBuffers,
}

impl KvCache {
    /// Allocates an f32 cache for `context` positions (see [`KvCache::with_kinds`]).
    pub fn new(ctx: &GpuContext, config: &ModelConfig, context: usize) -> Result<Self> {
        Self::with_kinds(ctx, config, context, KvKinds::default())
    }

    /// Allocates the cache for `context` positions with K and V in `kinds`; fails before
    /// allocating when one layer's buffer exceeds the device's binding limit (the message
    /// gives the numbers).
    pub fn with_kinds(
        ctx: &GpuContext,
        config: &ModelConfig,
        context: usize,
        kinds: KvKinds,
    ) -> Result<Self> {
        Self::with_slots(ctx, config, context, kinds, 1)
    }

    /// Allocates `slots` sequences of `context` positions each with K and V in `kinds` (see
    /// [`KvCache::with_kinds`]).
    pub fn with_slots(
        ctx: &GpuContext,
        config: &ModelConfig,
        context: usize,
        kinds: KvKinds,
        slots: usize,
    ) -> Result<Self> {
        if context == 0 {
            return Err(Error::invalid("context", "must be at least 1"));
        }
        if slots == 0 {
            return Err(Error::invalid("slots", "must be at least 1"));
        }
        let kv_dim = config.kv_dim();
        let rows = context.checked_mul(slots).ok_or_else(|| {
            Error::invalid(
                "slots",
                format!("{slots} slots of {context} positions overflow"),
            )
        })?;
        if u32::try_from(rows).is_err() {
            return Err(Error::invalid(
                "slots",
                format!("{slots} slots of {context} positions exceed 2^32 cache rows"),
            ));
        }
        let layer_bytes = |kind: crate::dtype::kv::KvKind| {
            (rows as u64)
                .checked_mul(kind.row_bytes(kv_dim))
                .ok_or_else(|| Error::invalid("context", format!("{rows} positions overflow")))
        };
        let (k_bytes, v_bytes) = (layer_bytes(kinds.k)?, layer_bytes(kinds.v)?);
        ctx.check_storage_size("KV cache layer", k_bytes.max(v_bytes))?;
        let mut k = Vec::with_capacity(config.n_layers);
        let mut v = Vec::with_capacity(config.n_layers);
        for layer in 0..config.n_layers {
            k.push(ctx.storage_zeroed(&format!("k cache {layer}"), k_bytes)?);
            v.push(ctx.storage_zeroed(&format!("v cache {layer}"), v_bytes)?);
        }
        let alive = AliveBuffers::new(
            ctx.counter_cells(),
            k.iter().chain(&v).map(wgpu::Buffer::size),
        );
        Ok(Self {
            _alive: alive,
            k,
            v,
            context,
            slots,
            kv_dim,
            kinds,
            pos: 0,
        })
    }

    /// The kinds K and V are stored in.
    pub fn kinds(&self) -> KvKinds {
        self.kinds
    }

    /// Positions one sequence (slot) holds at most.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Sequences the cache holds side by side.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Rows of every layer's buffers: `slots · context`.
    pub fn rows(&self) -> usize {
        self.slots * self.context
    }

    /// The first row of `slot`.
    pub fn slot_base(&self, slot: usize) -> usize {
        slot * self.context
    }

    /// Width of one cached row.
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Positions filled so far (the next token's position).
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Moves the fill mark: back to reuse a common prefix, forward after a step.
    pub fn set_pos(&mut self, pos: usize) -> Result<()> {
        if pos > self.context {
            return Err(Error::invalid(
                "pos",
                format!("{pos} is past the context length {}", self.context),
            ));
        }
        self.pos = pos;
        Ok(())
    }

    /// Bytes held on the GPU.
    pub fn bytes(&self) -> u64 {
        self.k.iter().chain(&self.v).map(|b| b.size()).sum()
    }

    /// Copies rows `[src_row, src_row + rows)` of every layer of `src` into rows
    /// `[dst_row, dst_row + rows)` of `dst` (one command buffer, one submit; positions unchanged).
    /// Used to give each beam of a beam search its own KV state.
    pub fn copy_rows(
        ctx: &GpuContext,
        src: &KvCache,
        src_row: usize,
        dst: &KvCache,
        dst_row: usize,
        rows: usize,
    ) -> Result<()> {
        if src.kv_dim != dst.kv_dim || src.k.len() != dst.k.len() {
            return Err(Error::invalid(
                "kv",
                "the two KV caches belong to different model shapes",
            ));
        }
        if src.kinds != dst.kinds {
            return Err(Error::invalid(
                "kv",
                format!(
                    "the two KV caches store different kinds ({} and {})",
                    src.kinds, dst.kinds
                ),
            ));
        }
        if src_row + rows > src.rows() || dst_row + rows > dst.rows() {
            return Err(Error::invalid(
                "rows",
                format!(
                    "copying {rows} rows from row {src_row} (of {}) to row {dst_row} (of {}) is out of range",
                    src.rows(), dst.rows()
                ),
            ));
        }
        if std::ptr::eq(src, dst) {
            return Err(Error::invalid(
                "kv",
                "rows are copied between two caches, not within one",
            ));
        }
        if rows == 0 {
            return Ok(());
        }
        let (k_row, v_row) = (
            src.kinds.k.row_bytes(src.kv_dim),
            src.kinds.v.row_bytes(src.kv_dim),
        );
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("kv copy"),
            });
        let pairs = (src.k.iter().zip(&dst.k).map(|p| (p, k_row)))
            .chain(src.v.iter().zip(&dst.v).map(|p| (p, v_row)));
        for ((from, to), row) in pairs {
            encoder.copy_buffer_to_buffer(
                from,
                src_row as u64 * row,
                to,
                dst_row as u64 * row,
                rows as u64 * row,
            );
        }
        ctx.counter_cells().submit(1);
        ctx.queue.submit([encoder.finish()]);
        Ok(())
    }
}
