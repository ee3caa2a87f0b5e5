//! The backends a session runs a model on, behind one trait.
//!
//! [`Backend`] is everything a session asks of a loaded model: run [`Rows`] and read back what
//! [`Readback`] asks for, and keep, rewind, save and restore the KV cache. It has two
//! implementations, which never reach each other:
//! - [`gpu`]: the device (WebGPU in the browser, Vulkan/Metal/DX12 natively), buffers, the
//!   kernel families and their plan, and [`gpu::GpuModel`], the forward pass recorded as
//!   compute passes;
//! - [`cpu`]: SIMD kernels (wasm SIMD128, AVX2, AVX-512 VNNI), the thread team and
//!   [`cpu::CpuForward`], the same graph run on them.
//!
//! Both run the graph each architecture builds ([`crate::model::arch`]); sessions hold a
//! `Box<dyn Backend>` and cannot tell them apart.

use std::future::Future;
use std::pin::Pin;

use crate::candidates::SelectRequest;
use crate::config::{FillMark, KvLayout, ModelConfig};
use crate::dtype::kv::KvKinds;
use crate::error::Result;
use crate::model::weights::ModelWeights;

pub mod cpu;
pub mod gpu;
pub(crate) mod readback;
pub mod step;

pub use readback::{MemoryReport, OnStep, Output, Readback, StepLogits};
pub use step::{BatchToken, Rows, DEFAULT_CHUNK};

/// The future of a backend call that may wait for the device (a readback, a pipeline built):
/// a GPU call awaits its queue, a CPU call is ready at once.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + 'a>>;

/// Which kind of backend runs a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// WebGPU in the browser, Vulkan/Metal/DX12 natively.
    #[default]
    Gpu,
    /// The CPU (wasm in the browser, native code otherwise).
    Cpu,
}

impl BackendKind {
    /// `"gpu"` or `"cpu"`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Gpu => "gpu",
            BackendKind::Cpu => "cpu",
        }
    }
}

/// A loaded model on one backend: its forward pass, its KV cache and what it reports.
///
/// Every step is one call of [`Backend::run`]; the calls below it are conveniences built on it.
pub trait Backend: std::fmt::Debug {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// What the matrix products run in: the GPU's precision (`f32`, `f16`), or on the CPU
    /// `int8` (8-bit activations) or `f32` (exact).
    fn precision_name(&self) -> &'static str;

    /// The CPU backend's precision (`None` on the GPU).
    fn cpu_precision(&self) -> Option<cpu::CpuPrecision> {
        None
    }

    /// The GPU device, for what the surfaces report of it (adapter, counters, a lost device);
    /// `None` on the CPU.
    fn gpu(&self) -> Option<&gpu::GpuContext> {
        None
    }

    /// The kernel plan (GPU only).
    fn plan(&self) -> Option<&gpu::KernelPlan> {
        None
    }

    /// What measurements on this backend are kept under in the tune store: the device (the
    /// GPU adapter's name, API and type, or the CPU backend's instruction set) and its driver
    /// (or the CPU backend's threads).
    fn device_key(&self) -> (String, String);

    /// The model's configuration.
    fn config(&self) -> &ModelConfig;

    /// Tokens per step.
    fn chunk(&self) -> usize;

    /// Dispatches (GPU) or operations (CPU) of a step that computes logits.
    fn node_count(&self) -> usize;

    /// Memory held by the model.
    fn memory(&self) -> MemoryReport;

    /// Loads `weights` on the same backend (and device) as `self`: a draft model.
    fn load_beside<'a>(
        &'a self,
        weights: &'a ModelWeights<'a>,
        context: usize,
    ) -> Pending<'a, Box<dyn Backend>>;

    /// Runs `rows` and reads back what `readback` asks for: the one step path of both
    /// backends. [`Rows::Next`] is cut into chunks of [`Backend::chunk`] tokens; the others
    /// fit one step. [`Readback::Sequences`] goes with [`Rows::Batch`] and nothing else.
    fn run<'a, 'r: 'a>(&'a mut self, rows: Rows<'a>, readback: Readback<'r>)
        -> Pending<'a, Output>;

    /// Row `row` of the last step's logits (`[vocab]`): for a step whose candidates did not
    /// suffice. On the GPU one more readback, no forward step.
    fn logits_row(&self, row: usize) -> Pending<'_, Vec<f32>>;

    /// Positions the main sequence holds.
    fn pos(&self) -> usize;

    /// KV positions per sequence.
    fn context(&self) -> usize;

    /// The KV cache's storage kinds.
    fn kv_kinds(&self) -> KvKinds;

    /// Forgets cached positions from `pos` on. Fails where a local layer's ring no longer
    /// holds what continuing from `pos` reads ([`Backend::reusable`] says how far back is safe).
    fn truncate(&mut self, pos: usize) -> Result<()>;

    /// The longest prefix of at most `pos` cached positions the model can continue from:
    /// `pos` (at most the cached positions), or 0 where a local layer's ring has since
    /// overwritten keys that continuing would read.
    fn reusable(&self, pos: usize) -> usize;

    /// How many positions the fill mark may always move back after a step (rejected draft
    /// tokens): a step's length with local layers' rings, unbounded without.
    fn rewind_limit(&self) -> usize;

    /// The KV cache's layout (rows per sequence of each layer).
    fn kv_layout(&self) -> &KvLayout;

    /// The main sequence's fill mark.
    fn kv_mark(&self) -> FillMark;

    /// The first `rows[l]` rows of the main sequence's K and V in every layer `l`, as stored
    /// (`[rows, row words]` each; f32 rows as their bits); on the GPU in one readback.
    fn kv_prefix<'a>(&'a self, rows: &'a [usize]) -> Pending<'a, Vec<(Vec<u32>, Vec<u32>)>>;

    /// Writes whole rows of K and V (as [`Backend::kv_prefix`] gives them) over the first rows
    /// of the main sequence in `layer`.
    fn write_kv_rows(&mut self, layer: usize, k: &[u32], v: &[u32]) -> Result<()>;

    /// Sets the main sequence's fill mark as a saved conversation recorded it (see
    /// [`FillMark::restored`]).
    fn restore_mark(&mut self, pos: usize, high: usize) -> Result<()>;

    /// Replaces the KV cache with one of `kinds` and `context` positions (forgets every
    /// cached position).
    fn set_kv(&mut self, kinds: KvKinds, context: usize) -> Pending<'_, ()>;

    /// KV slots for batched decoding: `slots` sequences of the current context. Reallocating
    /// forgets every cached position, of the main sequence too.
    fn set_batch(&mut self, slots: usize) -> Pending<'_, ()>;

    /// Sequences one batched step holds at most.
    fn max_batch(&self) -> usize;

    /// Sequences of the current context the KV cache can hold side by side (on the GPU, what
    /// one layer's binding holds; on the CPU, no limit but [`Backend::max_batch`]).
    fn slots_that_fit(&self) -> usize;

    /// Copies a slot's first `rows` positions into other slots.
    fn copy_slot_prefix(&mut self, from: usize, to: &[usize], rows: usize) -> Result<()>;

    /// Profiles the GPU's kernels; the CPU backend refuses (it has no kernel profile).
    fn profile(&mut self, _decode_pos: u32, _prompt_tokens: u32) -> Pending<'_, gpu::Profile> {
        Box::pin(std::future::ready(Err(crate::error::Error::invalid(
            "backend",
            "the kernel profile measures GPU kernels; this model runs on the CPU",
        ))))
    }
}

impl dyn Backend + '_ {
    /// The logits of the last token of `tokens` (run from the main sequence's position on),
    /// or of every token when `all_logits` (`[tokens · vocab]`).
    pub async fn forward(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>> {
        let readback = match all_logits {
            true => Readback::AllRows,
            false => Readback::LastRow,
        };
        match self.run(Rows::Next(tokens), readback).await? {
            Output::Logits(logits) => Ok(logits),
            _ => Ok(Vec::new()),
        }
    }

    /// One decode step of the main sequence: with `request`, the selection's candidates where
    /// the backend runs it on the device ([`StepLogits::Candidates`]), else the whole row.
    pub async fn decode_select(
        &mut self,
        token: u32,
        request: Option<&SelectRequest>,
    ) -> Result<StepLogits> {
        let readback = match request {
            Some(request) => Readback::Candidates(request),
            None => Readback::LastRow,
        };
        match self.run(Rows::Next(&[token]), readback).await? {
            Output::Candidates(c) => Ok(StepLogits::Candidates(c)),
            Output::Logits(row) => Ok(StepLogits::Full(row)),
            _ => Ok(StepLogits::Full(Vec::new())),
        }
    }

    /// The logits row of the last one-token step.
    pub async fn last_logits(&self) -> Result<Vec<f32>> {
        self.logits_row(0).await
    }

    /// One step for several sequences, sequence i with `requests[i]` (see
    /// [`Readback::Sequences`]).
    pub async fn decode_batch(
        &mut self,
        tokens: &[BatchToken],
        requests: &[Option<&SelectRequest>],
    ) -> Result<Vec<StepLogits>> {
        match self
            .run(Rows::Batch(tokens), Readback::Sequences(requests))
            .await?
        {
            Output::Sequences(rows) => Ok(rows),
            other => Err(crate::error::Error::invalid(
                "readback",
                format!("a batched step returned {other:?}"),
            )),
        }
    }
}
