//! The forward pass on the CPU: the same [`Graph`] the GPU compiles, run op by op on the
//! kernels of [`crate::backend::cpu`], with the weights in wasm or process memory in their stored
//! format and a KV cache cut into slots as the GPU's is. It implements the same
//! [`crate::backend::Backend`] as the GPU's model (`as_backend.rs`), so the session cannot tell
//! them apart.

use std::collections::HashMap;

use crate::backend::cpu::kv::KvRows;
use crate::backend::cpu::{CpuPrecision, QMatrix};
use crate::backend::readback::{Collect, Head, MemoryReport, Output, Readback, StepLogits};
use crate::backend::BatchToken;
use crate::candidates::SelectRequest;
use crate::config::{FillMark, KvLayout, ModelConfig};
use crate::dtype::kv::KvKinds;
use crate::error::{Error, Result};
use crate::model::graph::{Graph, WeightIndex};
use crate::model::weights::ModelWeights;

mod address_space;
mod as_backend;
mod load;
mod step;

pub use address_space::{check_address_space, context_for, longest_context_within};

/// The most sequences one batched step holds (as on the GPU).
const MAX_BATCH: usize = 64;

/// The weights as the CPU backend holds them.
#[derive(Debug)]
struct CpuWeights {
    /// Every matrix (and embedding table), stored format, `[rows, cols]`.
    mats: HashMap<String, QMatrix>,
    /// Every vector (norm gains and shifts, biases), f32.
    vecs: HashMap<String, Vec<f32>>,
    /// Shapes of both, for the graph builder.
    shapes: HashMap<String, Vec<usize>>,
}

impl WeightIndex for CpuWeights {
    fn shape(&self, name: &str) -> Option<&[usize]> {
        self.shapes.get(name).map(Vec::as_slice)
    }
}

/// The KV cache: per layer, `slots · rows` rows of `kv_dim` keys and values in their kinds,
/// `rows` being the layer's rows per sequence in the layout (the context, or a local layer's
/// ring).
#[derive(Debug)]
struct CpuKv {
    k: Vec<KvRows>,
    v: Vec<KvRows>,
    kinds: KvKinds,
    layout: KvLayout,
    context: usize,
    slots: usize,
    /// The main sequence's (slot 0's) fill mark.
    mark: FillMark,
}

impl CpuKv {
    fn new(config: &ModelConfig, kinds: KvKinds, layout: KvLayout, slots: usize) -> Result<Self> {
        let layers = |kind| {
            (0..config.n_layers)
                .map(|l| {
                    let rows = layout.rows(l).checked_mul(slots).ok_or_else(|| {
                        Error::invalid("context", "the KV cache's size overflows")
                    })?;
                    KvRows::new(kind, config.kv_dim(), rows)
                })
                .collect::<Result<Vec<_>>>()
        };
        Ok(Self {
            k: layers(kinds.k)?,
            v: layers(kinds.v)?,
            kinds,
            context: layout.context(),
            layout,
            slots,
            mark: FillMark::default(),
        })
    }

    fn bytes(&self) -> u64 {
        self.k.iter().chain(&self.v).map(KvRows::bytes).sum()
    }
}

/// A model ready to run on the CPU.
#[derive(Debug)]
pub struct CpuForward {
    config: ModelConfig,
    chunk: usize,
    graph: Graph,
    weights: CpuWeights,
    kv: CpuKv,
    /// Per layer, the RoPE frequency of each pair, `[head_dim / 2]`.
    freqs: Vec<Vec<f64>>,
    /// The logits of the last step, `[rows, vocab]` (what [`Self::logits_row`] reads).
    logits: Vec<f32>,
    memory: MemoryReport,
    /// What the quantized matrices are multiplied with.
    precision: CpuPrecision,
}

impl CpuForward {
    /// Keeps the matrices in their stored format where the file holds them (shared, not copied:
    /// [`ModelWeights::keep`]), the vectors as f32; allocates an f32 KV cache of `context`
    /// positions, builds the graph.
    pub fn new(weights: &ModelWeights<'_>, context: usize, chunk: usize) -> Result<Self> {
        Self::with_precision(weights, context, chunk, CpuPrecision::Int8)
    }

    /// [`Self::new`] with the matrix products in `precision` (8-bit activations, or exact f32).
    pub fn with_precision(
        weights: &ModelWeights<'_>,
        context: usize,
        chunk: usize,
        precision: CpuPrecision,
    ) -> Result<Self> {
        Self::with_kinds(weights, context, chunk, precision, KvKinds::default())
    }

    /// What the quantized matrices are multiplied with.
    pub fn precision(&self) -> CpuPrecision {
        self.precision
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Tokens per step.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// Operations per step (the graph's, and the head).
    pub fn node_count(&self) -> usize {
        self.graph.ops.len() + 1
    }

    /// How many of the matrices are kept in tiles (copies of the backend's own, multiplied a
    /// tile at a time), of how many in all.
    pub fn matrices_in_tiles(&self) -> (usize, usize) {
        let mats = self.weights.mats.values();
        (mats.clone().filter(|m| m.is_tiled()).count(), mats.len())
    }

    /// Memory held: weights, KV cache (activations are allocated per step).
    pub fn memory(&self) -> MemoryReport {
        self.memory
    }

    /// Positions the main sequence holds (the next token's position).
    pub fn pos(&self) -> usize {
        self.kv.mark.pos()
    }

    /// KV positions per sequence.
    pub fn context(&self) -> usize {
        self.kv.context
    }

    /// KV slots (sequences the cache holds side by side).
    pub fn slots(&self) -> usize {
        self.kv.slots
    }

    /// The cache's storage kinds (always f32 here).
    pub fn kv_kinds(&self) -> KvKinds {
        self.kv.kinds
    }

    /// Forgets cached positions from `pos` on; fails where a local layer's ring no longer
    /// holds what continuing from `pos` reads (see [`FillMark::set`]).
    pub fn truncate(&mut self, pos: usize) -> Result<()> {
        if pos > self.kv.mark.pos() {
            return Err(Error::invalid(
                "pos",
                format!("{pos} is past the cached {} positions", self.kv.mark.pos()),
            ));
        }
        self.kv.mark.set(pos, &self.kv.layout)
    }

    /// The longest prefix of at most `pos` cached positions the cache can still continue
    /// from (see [`FillMark::reusable`]).
    pub fn reusable(&self, pos: usize) -> usize {
        self.kv.mark.reusable(pos, &self.kv.layout)
    }

    /// The KV cache's layout (rows per sequence of each layer).
    pub fn kv_layout(&self) -> &KvLayout {
        &self.kv.layout
    }

    /// The main sequence's fill mark.
    pub fn kv_mark(&self) -> FillMark {
        self.kv.mark
    }

    /// The first `rows` rows of the main sequence's K and V in `layer`, as stored.
    pub fn kv_rows(&self, layer: usize, rows: usize) -> Result<(Vec<u32>, Vec<u32>)> {
        let (Some(k), Some(v)) = (self.kv.k.get(layer), self.kv.v.get(layer)) else {
            return Err(Error::invalid(
                "layer",
                format!("{layer} is past the model's layers"),
            ));
        };
        let rows = rows.min(self.kv.layout.rows(layer));
        Ok((k.words(rows), v.words(rows)))
    }

    /// Writes whole rows of K and V over the first rows of the main sequence in `layer`.
    pub fn write_kv_rows(&mut self, layer: usize, k: &[u32], v: &[u32]) -> Result<()> {
        let (Some(kr), Some(vr)) = (self.kv.k.get_mut(layer), self.kv.v.get_mut(layer)) else {
            return Err(Error::invalid(
                "layer",
                format!("{layer} is past the model's layers"),
            ));
        };
        let rows = self.kv.layout.rows(layer);
        let (k_row, v_row) = (
            self.kv.kinds.k.row_words(self.config.kv_dim()),
            self.kv.kinds.v.row_words(self.config.kv_dim()),
        );
        if k.len() > rows * k_row || v.len() > rows * v_row {
            return Err(Error::invalid(
                "kv",
                format!("more rows than layer {layer} keeps per sequence ({rows})"),
            ));
        }
        kr.set_words(k)?;
        vr.set_words(v)
    }

    /// Sets the main sequence's fill mark as a saved conversation recorded it.
    pub fn restore_mark(&mut self, pos: usize, high: usize) -> Result<()> {
        self.kv.mark = FillMark::restored(pos, high, &self.kv.layout)?;
        Ok(())
    }

    /// How far back the fill mark may always move after a step (see [`KvLayout::slack`]).
    pub fn rewind_limit(&self) -> usize {
        self.kv.layout.slack()
    }

    /// Replaces the KV cache by one of `context` positions storing K and V in `kinds`.
    pub fn set_kv(&mut self, kinds: KvKinds, context: usize) -> Result<()> {
        self.rebuild(kinds, context, 1)
    }

    /// The cache holds `slots` sequences of the current context (forgetting what it held
    /// unless the count is unchanged).
    pub fn set_batch(&mut self, slots: usize) -> Result<()> {
        if slots == 0 {
            return Err(Error::invalid("slots", "must be at least 1"));
        }
        if slots != self.kv.slots {
            let (kinds, context) = (self.kv.kinds, self.kv.context);
            if let Err(e) = self.rebuild(kinds, context, slots) {
                self.rebuild(kinds, context, 1)?;
                return Err(e);
            }
        }
        Ok(())
    }

    fn rebuild(&mut self, kinds: KvKinds, context: usize, slots: usize) -> Result<()> {
        crate::backend::step::check_context(&self.config, context)?;
        // the old cache goes first, so that both never take memory at once
        self.kv = CpuKv::new(
            &self.config,
            kinds,
            KvLayout::full(self.config.n_layers, 1),
            1,
        )?;
        let layout = KvLayout::trained(&self.config, context, self.chunk);
        self.kv = CpuKv::new(&self.config, kinds, layout, slots)?;
        self.memory.kv_cache = self.kv.bytes();
        self.memory.kv_bytes_per_token = self
            .kv
            .layout
            .position_bytes(kinds.row_bytes(self.config.kv_dim()));
        Ok(())
    }

    /// Sequences one batched step holds at most.
    pub fn max_batch(&self) -> usize {
        MAX_BATCH.min(self.chunk)
    }
    /// Runs `tokens` from the main sequence's position on (see [`crate::backend::Backend::run`]).
    /// A request for candidates is answered with the last row's logits.
    pub fn run(&mut self, tokens: &[u32], readback: Readback<'_>) -> Result<Output> {
        let pos = self.kv.mark.pos();
        self.run_at(None, pos, tokens, readback)
    }

    /// [`Self::run`] for the sequence in `slot`, whose positions before `pos` are cached.
    pub fn run_in_slot(
        &mut self,
        slot: usize,
        pos: usize,
        tokens: &[u32],
        readback: Readback<'_>,
    ) -> Result<Output> {
        if slot >= self.kv.slots {
            return Err(Error::invalid(
                "slot",
                format!("{slot} is not one of the cache's {} slots", self.kv.slots),
            ));
        }
        self.run_at(Some(slot), pos, tokens, readback)
    }

    fn run_at(
        &mut self,
        slot: Option<usize>,
        pos: usize,
        tokens: &[u32],
        readback: Readback<'_>,
    ) -> Result<Output> {
        if tokens.is_empty() {
            return Err(Error::invalid("tokens", "at least one token is needed"));
        }
        self.check_ids(tokens)?;
        crate::backend::step::check_whole_text(&self.config, pos, tokens.len(), self.chunk)?;
        if pos + tokens.len() > self.kv.context {
            return Err(Error::invalid(
                "tokens",
                format!(
                    "{} tokens after {pos} cached ones exceed the context of {}",
                    tokens.len(),
                    self.kv.context
                ),
            ));
        }
        let slot_index = slot.unwrap_or(0);
        let (mut collect, _) = Collect::new(readback, tokens.len(), 0)?;
        let n_chunks = tokens.len().div_ceil(self.chunk);
        let mut ran = 0;
        for (i, chunk) in tokens.chunks(self.chunk).enumerate() {
            let last = i + 1 == n_chunks;
            let head = collect.head(last);
            let rows: Vec<step::Row> = (0..chunk.len())
                .map(|j| step::Row {
                    pos: pos + ran + j,
                    slot: slot_index,
                })
                .collect();
            if slot.is_none() {
                // before the step: a step that fails late has still written its rows
                self.kv.mark.note_written(pos + ran + chunk.len());
            }
            self.step(chunk, &rows, head)?;
            let first = ran;
            ran += chunk.len();
            if slot.is_none() {
                self.kv.mark.set(pos + ran, &self.kv.layout)?;
            }
            let rows = match head {
                Head::None => Vec::new(),
                _ => self.logits.clone(),
            };
            if let Some(out) = collect.step(first, chunk.len(), rows, last, ran)? {
                return Ok(out);
            }
        }
        Ok(collect.finish(ran))
    }

    /// One decode step for several sequences, each at its position in its slot; every row's
    /// logits come back ([`StepLogits::Full`]).
    pub fn decode_batch(
        &mut self,
        tokens: &[BatchToken],
        requests: &[Option<&SelectRequest>],
    ) -> Result<Vec<StepLogits>> {
        let n = tokens.len();
        if requests.len() != n {
            return Err(Error::invalid(
                "requests",
                format!("{} requests for {n} sequences", requests.len()),
            ));
        }
        if n == 0 || n > self.max_batch() {
            return Err(Error::invalid(
                "tokens",
                format!("{n} sequences in one step; 1 to {} fit", self.max_batch()),
            ));
        }
        let ids: Vec<u32> = tokens.iter().map(|t| t.token).collect();
        self.check_ids(&ids)?;
        let mut seen = vec![false; self.kv.slots];
        let mut rows = Vec::with_capacity(n);
        for t in tokens {
            if t.slot >= self.kv.slots || std::mem::replace(&mut seen[t.slot], true) {
                return Err(Error::invalid(
                    "slot",
                    format!(
                        "slot {} is not one of the cache's {} or is used twice",
                        t.slot, self.kv.slots
                    ),
                ));
            }
            if t.pos >= self.kv.context {
                return Err(Error::invalid(
                    "pos",
                    format!("{} is past the context of {}", t.pos, self.kv.context),
                ));
            }
            rows.push(step::Row {
                pos: t.pos,
                slot: t.slot,
            });
        }
        self.step(&ids, &rows, Head::All)?;
        let vocab = self.config.vocab_size;
        Ok(self
            .logits
            .chunks_exact(vocab)
            .map(|r| StepLogits::Full(r.to_vec()))
            .collect())
    }

    /// Copies positions `0..rows` of slot `from` into the slots `to`.
    pub fn copy_slot_prefix(&mut self, from: usize, to: &[usize], rows: usize) -> Result<()> {
        let slots = self.kv.slots;
        if let Some(bad) = std::iter::once(&from).chain(to).find(|&&s| s >= slots) {
            return Err(Error::invalid(
                "slot",
                format!("{bad} is not one of the cache's {slots} slots"),
            ));
        }
        if rows > self.kv.context {
            return Err(Error::invalid(
                "rows",
                format!("{rows} is past the context of {}", self.kv.context),
            ));
        }
        // a ring that has wrapped is copied whole: position p keeps row p mod ring
        let layout = &self.kv.layout;
        let layers = self.kv.k.iter_mut().zip(self.kv.v.iter_mut()).enumerate();
        for (l, (k, v)) in layers {
            let per = layout.rows(l);
            for &s in to.iter().filter(|&&s| s != from) {
                k.copy_rows(from * per, s * per, rows.min(per));
                v.copy_rows(from * per, s * per, rows.min(per));
            }
        }
        Ok(())
    }

    /// Row `row` of the last step's logits, `[vocab]`.
    pub fn logits_row(&self, row: usize) -> Result<Vec<f32>> {
        let vocab = self.config.vocab_size;
        self.logits
            .get(row * vocab..(row + 1) * vocab)
            .map(<[f32]>::to_vec)
            .ok_or_else(|| {
                Error::invalid(
                    "row",
                    format!("{row} is not a row of the last step's logits"),
                )
            })
    }

    fn check_ids(&self, tokens: &[u32]) -> Result<()> {
        crate::backend::step::check_ids(tokens, self.config.vocab_size)
    }
}
