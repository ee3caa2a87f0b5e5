//! [`CpuForward`] as a [`Backend`]: every call is ready at once (nothing waits for a device).

use super::CpuForward;
use crate::backend::cpu::CpuPrecision;
use crate::backend::{
    Backend, BackendKind, MemoryReport, Output, Pending, Readback, Rows, DEFAULT_CHUNK,
};
use crate::config::{FillMark, KvLayout, ModelConfig};
use crate::dtype::kv::KvKinds;
use crate::error::Result;
use crate::model::weights::ModelWeights;

/// A call's result as a [`Pending`] that is ready.
fn ready<'a, T: 'a>(result: Result<T>) -> Pending<'a, T> {
    Box::pin(std::future::ready(result))
}

impl CpuForward {
    /// `weights` on the CPU backend with a KV cache of `context` positions, 8-bit activations
    /// and prefill steps of [`DEFAULT_CHUNK`] tokens, as a [`Backend`].
    pub fn backend(weights: &ModelWeights<'_>, context: usize) -> Result<Box<dyn Backend>> {
        Ok(Box::new(Self::new(weights, context, DEFAULT_CHUNK)?))
    }

    fn run_rows(&mut self, rows: Rows<'_>, readback: Readback<'_>) -> Result<Output> {
        if self.graph.head.is_none() && readback.reads_logits() {
            return Err(crate::model::graph::no_lm_head(&self.config));
        }
        match rows {
            Rows::Next(tokens) => self.run(tokens, readback),
            Rows::InSlot { slot, pos, tokens } => self.run_in_slot(slot, pos, tokens, readback),
            Rows::Batch(tokens) => Ok(Output::Sequences(
                self.decode_batch(tokens, readback.sequences()?)?,
            )),
        }
    }
}

impl Backend for CpuForward {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn precision_name(&self) -> &'static str {
        self.precision().as_str()
    }

    fn cpu_precision(&self) -> Option<CpuPrecision> {
        Some(self.precision())
    }

    fn device_key(&self) -> (String, String) {
        (
            format!("cpu [{}]", crate::backend::cpu::dot::instruction_set()),
            format!("{} threads", crate::backend::cpu::threads()),
        )
    }

    fn config(&self) -> &ModelConfig {
        CpuForward::config(self)
    }

    fn chunk(&self) -> usize {
        CpuForward::chunk(self)
    }

    fn node_count(&self) -> usize {
        CpuForward::node_count(self)
    }

    fn memory(&self) -> MemoryReport {
        CpuForward::memory(self)
    }

    fn load_beside<'a>(
        &'a self,
        weights: &'a ModelWeights<'a>,
        context: usize,
    ) -> Pending<'a, Box<dyn Backend>> {
        let loaded = CpuForward::with_precision(weights, context, DEFAULT_CHUNK, self.precision());
        ready(loaded.map(|c| Box::new(c) as Box<dyn Backend>))
    }

    fn run<'a, 'r: 'a>(
        &'a mut self,
        rows: Rows<'a>,
        readback: Readback<'r>,
    ) -> Pending<'a, Output> {
        ready(self.run_rows(rows, readback))
    }

    fn logits_row(&self, row: usize) -> Pending<'_, Vec<f32>> {
        ready(CpuForward::logits_row(self, row))
    }

    fn pos(&self) -> usize {
        CpuForward::pos(self)
    }

    fn context(&self) -> usize {
        CpuForward::context(self)
    }

    fn kv_kinds(&self) -> KvKinds {
        CpuForward::kv_kinds(self)
    }

    fn truncate(&mut self, pos: usize) -> Result<()> {
        CpuForward::truncate(self, pos)
    }

    fn reusable(&self, pos: usize) -> usize {
        CpuForward::reusable(self, pos)
    }

    fn rewind_limit(&self) -> usize {
        CpuForward::rewind_limit(self)
    }

    fn kv_layout(&self) -> &KvLayout {
        CpuForward::kv_layout(self)
    }

    fn kv_mark(&self) -> FillMark {
        CpuForward::kv_mark(self)
    }

    fn kv_prefix<'a>(&'a self, rows: &'a [usize]) -> Pending<'a, Vec<(Vec<u32>, Vec<u32>)>> {
        ready(
            rows.iter()
                .enumerate()
                .map(|(layer, &n)| self.kv_rows(layer, n))
                .collect(),
        )
    }

    fn write_kv_rows(&mut self, layer: usize, k: &[u32], v: &[u32]) -> Result<()> {
        CpuForward::write_kv_rows(self, layer, k, v)
    }

    fn restore_mark(&mut self, pos: usize, high: usize) -> Result<()> {
        CpuForward::restore_mark(self, pos, high)
    }

    fn set_kv(&mut self, kinds: KvKinds, context: usize) -> Pending<'_, ()> {
        ready(CpuForward::set_kv(self, kinds, context))
    }

    fn set_batch(&mut self, slots: usize) -> Pending<'_, ()> {
        ready(CpuForward::set_batch(self, slots))
    }

    fn max_batch(&self) -> usize {
        CpuForward::max_batch(self)
    }

    fn slots_that_fit(&self) -> usize {
        CpuForward::max_batch(self)
    }

    fn copy_slot_prefix(&mut self, from: usize, to: &[usize], rows: usize) -> Result<()> {
        CpuForward::copy_slot_prefix(self, from, to, rows)
    }
}
