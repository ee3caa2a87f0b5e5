//! The KV cache: K and V for every layer, in their kinds ([`KvKinds`]: f32, f16, q8_0, q4_0,
//! nf4), allocated once for the chosen context length, with a ring of rows for each
//! local-attention layer ([`KvLayout`]).

use crate::config::{FillMark, KvLayout, ModelConfig};
use crate::dtype::kv::KvKinds;
use crate::error::{Error, Result};

use super::counters::AliveBuffers;
use super::device::GpuContext;

/// Per layer, a K and a V buffer of `slots · rows` rows of `kv_dim` values each, a row
/// stored in [`crate::dtype::kv::KvKind::row_words`] u32 words of its kind
/// (`[slots · rows, kv_dim]` f32 for f32), where `rows` is the layer's rows per sequence in
/// the [`KvLayout`]: the context, or a local layer's ring. Each slot holds one sequence of up
/// to `context` positions (slot `s`'s position `p` is row [`KvLayout::row`], `s · context + p`
/// outside rings); slot 0 is the main sequence, whose fill mark [`KvCache::pos`] tracks, and
/// the others serve batched decoding. Positions advance as tokens are processed; nothing is
/// ever re-uploaded.
#[derive(Debug)]
pub struct KvCache {
    /// K per layer, `[slots · rows, row words of kinds.k]`.
    pub k: Vec<wgpu::Buffer>,
    /// V per layer, `[slots · rows, row words of kinds.v]`.
    pub v: Vec<wgpu::Buffer>,
    layout: KvLayout,
    context: usize,
    slots: usize,
    kv_dim: usize,
    kinds: KvKinds,
    mark: FillMark,
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
    /// [`KvCache::with_kinds`]), every layer keeping every position.
    pub fn with_slots(
        ctx: &GpuContext,
        config: &ModelConfig,
        context: usize,
        kinds: KvKinds,
        slots: usize,
    ) -> Result<Self> {
        Self::with_layout(
            ctx,
            config,
            KvLayout::full(config.n_layers, context),
            kinds,
            slots,
        )
    }

    /// Allocates `slots` sequences laid out as `layout` says (its context, and a ring per
    /// local layer) with K and V in `kinds` (see [`KvCache::with_kinds`]).
    pub fn with_layout(
        ctx: &GpuContext,
        config: &ModelConfig,
        layout: KvLayout,
        kinds: KvKinds,
        slots: usize,
    ) -> Result<Self> {
        let context = layout.context();
        if context == 0 {
            return Err(Error::invalid("context", "must be at least 1"));
        }
        if slots == 0 {
            return Err(Error::invalid("slots", "must be at least 1"));
        }
        if layout.layers() != config.n_layers {
            return Err(Error::invalid(
                "kv",
                format!(
                    "a cache layout of {} layers for a model of {}",
                    layout.layers(),
                    config.n_layers
                ),
            ));
        }
        let kv_dim = config.kv_dim();
        let mut sizes = Vec::with_capacity(config.n_layers);
        for layer in 0..config.n_layers {
            let rows = layout.rows(layer).checked_mul(slots).ok_or_else(|| {
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
            sizes.push((k_bytes, v_bytes));
        }
        let mut k = Vec::with_capacity(config.n_layers);
        let mut v = Vec::with_capacity(config.n_layers);
        for (layer, (k_bytes, v_bytes)) in sizes.into_iter().enumerate() {
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
            layout,
            context,
            slots,
            kv_dim,
            kinds,
            mark: FillMark::default(),
        })
    }

    /// Where each layer keeps a sequence's positions.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
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

    /// The first row of `slot` in the caches of layers that keep every position.
    pub fn slot_base(&self, slot: usize) -> usize {
        slot * self.context
    }

    /// Width of one cached row.
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Positions filled so far (the next token's position).
    pub fn pos(&self) -> usize {
        self.mark.pos()
    }

    /// Moves the fill mark: back to reuse a common prefix, forward after a step (see
    /// [`FillMark::set`]: moving back past what the rings hold fails; 0 always succeeds).
    pub fn set_pos(&mut self, pos: usize) -> Result<()> {
        self.mark.set(pos, &self.layout)
    }

    /// Records that the main sequence's positions below `end` are being written (see
    /// [`FillMark::note_written`]).
    pub fn note_written(&mut self, end: usize) {
        self.mark.note_written(end);
    }

    /// The longest prefix of at most `pos` cached positions the cache can still continue
    /// from (see [`FillMark::reusable`]).
    pub fn reusable(&self, pos: usize) -> usize {
        self.mark.reusable(pos, &self.layout)
    }

    /// The main sequence's fill mark.
    pub fn mark(&self) -> FillMark {
        self.mark
    }

    /// Sets the main sequence's fill mark as a saved conversation recorded it (see
    /// [`FillMark::restored`]).
    pub fn restore_mark(&mut self, pos: usize, high: usize) -> Result<()> {
        self.mark = FillMark::restored(pos, high, &self.layout)?;
        Ok(())
    }

    /// The first `rows[l]` rows of the main sequence's K and V in every layer `l`, as stored
    /// (`[rows, row words]` each): what a saved conversation keeps. The whole cache comes back
    /// in one copy into one staging buffer, one submit and one map.
    pub async fn read_prefix(
        &self,
        ctx: &GpuContext,
        rows: &[usize],
    ) -> Result<Vec<(Vec<u32>, Vec<u32>)>> {
        if rows.len() != self.k.len() {
            return Err(Error::invalid(
                "rows",
                format!("{} layers asked of a cache of {}", rows.len(), self.k.len()),
            ));
        }
        let (k_row, v_row) = (
            self.kinds.k.row_bytes(self.kv_dim),
            self.kinds.v.row_bytes(self.kv_dim),
        );
        let spans: Vec<(u64, u64)> = rows
            .iter()
            .enumerate()
            .map(|(l, &n)| {
                let n = n.min(self.layout.rows(l)) as u64;
                (n * k_row, n * v_row)
            })
            .collect();
        let total: u64 = spans.iter().map(|(k, v)| k + v).sum();
        if total == 0 {
            return Ok(vec![(Vec::new(), Vec::new()); rows.len()]);
        }
        ctx.check()?;
        let staging = ctx.staging_buffer("kv cache readback", total);
        let _alive = AliveBuffers::new(ctx.counter_cells(), [staging.size()]);
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("kv cache readback"),
            });
        let mut at = 0;
        for (l, &(k, v)) in spans.iter().enumerate() {
            for (buffer, bytes) in [(&self.k[l], k), (&self.v[l], v)] {
                if bytes > 0 {
                    encoder.copy_buffer_to_buffer(buffer, 0, &staging, at, bytes);
                }
                at += bytes;
            }
        }
        ctx.counter_cells().submit(1);
        let submission = ctx.queue.submit([encoder.finish()]);
        let bytes = ctx.read_staging(&staging, total, submission).await?;
        let mut at = 0usize;
        let mut take = |n: u64| {
            let words = bytemuck::pod_collect_to_vec(&bytes[at..at + n as usize]);
            at += n as usize;
            words
        };
        Ok(spans.iter().map(|&(k, v)| (take(k), take(v))).collect())
    }

    /// Writes `k` and `v` (whole rows as [`KvCache::read_prefix`] gives them) over the first
    /// rows of the main sequence in `layer`.
    pub fn write_rows(&self, ctx: &GpuContext, layer: usize, k: &[u32], v: &[u32]) -> Result<()> {
        let (Some(kb), Some(vb)) = (self.k.get(layer), self.v.get(layer)) else {
            return Err(Error::invalid(
                "layer",
                format!("{layer} is past the model's layers"),
            ));
        };
        let rows = self.layout.rows(layer) as u64;
        for (buffer, words, row) in [
            (kb, k, self.kinds.k.row_bytes(self.kv_dim)),
            (vb, v, self.kinds.v.row_bytes(self.kv_dim)),
        ] {
            let bytes = words.len() as u64 * 4;
            if row == 0 || !bytes.is_multiple_of(row) || bytes / row > rows {
                return Err(Error::invalid(
                    "kv",
                    format!("{bytes} bytes are not whole rows of {row} within the layer's {rows}"),
                ));
            }
            if bytes > 0 {
                ctx.queue
                    .write_buffer(buffer, 0, bytemuck::cast_slice(words));
            }
        }
        Ok(())
    }

    /// Bytes held on the GPU.
    pub fn bytes(&self) -> u64 {
        self.k.iter().chain(&self.v).map(|b| b.size()).sum()
    }

    /// Copies positions `0..positions` of slot `src_slot` of every layer of `src` into slot
    /// `dst_slot` of `dst` (one command buffer, one submit; fill marks unchanged): per layer,
    /// the first `min(positions, rows)` rows of the slot, which for a ring that has wrapped is
    /// the whole ring (then both caches must keep that layer in rings of one length). Used to
    /// give each sample of a prompt its own KV state.
    pub fn copy_positions(
        ctx: &GpuContext,
        (src, src_slot): (&KvCache, usize),
        (dst, dst_slot): (&KvCache, usize),
        positions: usize,
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
        if std::ptr::eq(src, dst) {
            return Err(Error::invalid(
                "kv",
                "positions are copied between two caches, not within one",
            ));
        }
        if src_slot >= src.slots || dst_slot >= dst.slots {
            return Err(Error::invalid(
                "slot",
                format!(
                    "copying slot {src_slot} (of {}) to slot {dst_slot} (of {}) is out of range",
                    src.slots, dst.slots
                ),
            ));
        }
        if positions > src.context || positions > dst.context {
            return Err(Error::invalid(
                "positions",
                format!(
                    "{positions} positions exceed a context ({} and {})",
                    src.context, dst.context
                ),
            ));
        }
        let mut spans = Vec::with_capacity(src.k.len());
        for layer in 0..src.k.len() {
            let (from_rows, to_rows) = (src.layout.rows(layer), dst.layout.rows(layer));
            let n = positions.min(from_rows);
            if n > to_rows || (positions > from_rows && from_rows != to_rows) {
                return Err(Error::invalid(
                    "kv",
                    format!(
                        "layer {layer} keeps {positions} positions in {from_rows} rows, which a cache of {to_rows} rows per sequence cannot take"
                    ),
                ));
            }
            spans.push((src_slot * from_rows, dst_slot * to_rows, n));
        }
        if positions == 0 {
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
        let pairs = (src
            .k
            .iter()
            .zip(&dst.k)
            .zip(&spans)
            .map(|(p, s)| (p, s, k_row)))
        .chain(
            src.v
                .iter()
                .zip(&dst.v)
                .zip(&spans)
                .map(|(p, s)| (p, s, v_row)),
        );
        for ((from, to), &(src_row, dst_row, rows), row) in pairs {
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
