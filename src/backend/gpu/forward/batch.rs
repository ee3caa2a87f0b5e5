//! Batched decoding on the forward pass: the KV cache cut into slots, one sequence each, and
//! one step that advances several sequences by one token each, every one at its own position
//! and over its own slot's keys, with the matrix products reading each weight once for all of
//! them. The step is still one compute pass, one submit and one readback: each sequence's
//! candidate selection (or, without one, every row of logits).

use super::upload::f32_bytes;
use super::{Forward, Step, StepHead, StepLogits, StepRead};
use crate::backend::gpu::ops::Select;
use crate::backend::gpu::{GpuContext, KernelCache, KvCache, StepParams, StepRow, STEP_ROWS};
use crate::backend::BatchToken;
use crate::candidates::{Candidates, SelectRequest, MAX_RESULT_BYTES};
use crate::error::{Error, Result};

/// The selections and readback of batched steps: one [`Select`] per row after the first
/// (row 0 uses the forward pass's own) and a staging buffer of `rows · MAX_RESULT_BYTES`.
#[derive(Debug, Default)]
pub(super) struct BatchBuffers {
    selects: Vec<Select>,
    staging: Option<wgpu::Buffer>,
}

impl BatchBuffers {
    /// Frees everything (the cache is being rebuilt).
    pub(super) fn clear(&mut self) {
        self.selects.clear();
        self.staging = None;
    }

    /// GPU bytes held.
    pub(super) fn bytes(&self) -> u64 {
        self.selects.iter().map(Select::bytes).sum::<u64>()
            + self.staging.as_ref().map_or(0, wgpu::Buffer::size)
    }
}

/// Each row's candidates from the bytes [`Forward::copy_selected`] read back.
pub(super) fn parse_selected(
    data: &[u8],
    selects: &[(&Select, &SelectRequest)],
) -> Result<Vec<Candidates>> {
    let mut at = 0;
    selects
        .iter()
        .enumerate()
        .map(|(i, (_, request))| {
            let end = at + request.result_bytes() as usize;
            let bytes = data.get(at..end).ok_or_else(|| Error::Readback {
                buffer: "row select readback".to_string(),
                message: format!("{} bytes read, row {i} ends at {end}", data.len()),
            })?;
            at = end;
            Select::parse(bytes, request)
        })
        .collect()
}

impl Forward {
    /// Fails unless every id is inside the vocabulary.
    pub(super) fn check_ids(&self, tokens: &[u32]) -> crate::error::Result<()> {
        crate::backend::step::check_ids(tokens, self.config.vocab_size)
    }

    /// Sequences one batched step holds at most: [`STEP_ROWS`], and the tokens of one step
    /// ([`Forward::chunk`]).
    pub fn max_batch(&self) -> usize {
        STEP_ROWS.min(self.chunk)
    }

    /// Bytes of K and V one more slot of the current context takes (all layers).
    pub fn slot_bytes(&self) -> u64 {
        self.kv.bytes() / self.kv.slots() as u64
    }

    /// Makes the KV cache hold `slots` sequences of the current context each (in the current
    /// kinds) and the per-row selections for steps of up to `min(slots, max_batch)` sequences.
    /// Reallocating forgets every cached position, of the main sequence too; asking for the
    /// slots the cache already has keeps them. Fails with the numbers when one layer's
    /// buffer would exceed the device's binding limit, leaving one slot of the context.
    pub async fn set_batch(
        &mut self,
        ctx: &GpuContext,
        cache: &KernelCache,
        slots: usize,
    ) -> Result<()> {
        if slots == 0 {
            return Err(Error::invalid("slots", "must be at least 1"));
        }
        if slots != self.kv.slots() {
            let (kinds, context) = (self.kv.kinds(), self.kv.context());
            if let Err(e) = self.rebuild_kv(ctx, cache, kinds, context, slots).await {
                // back to one sequence of the same context, so that the model stays usable
                self.rebuild_kv(ctx, cache, kinds, context, 1).await?;
                return Err(e);
            }
        }
        self.memory.kv_cache = self.kv.bytes();
        self.ensure_row_selects(ctx, cache, slots).await
    }

    /// Gives rows `0..rows` of a step's logits a candidate selection each (at most
    /// [`Self::max_batch`] rows; row 0 has the forward pass's own) and their readback: for a
    /// batched step's sequences or a speculative step's positions. Selections made before
    /// stay; nothing happens on a device that cannot run the selection.
    pub async fn ensure_row_selects(
        &mut self,
        ctx: &GpuContext,
        cache: &KernelCache,
        rows: usize,
    ) -> Result<()> {
        if self.select.is_none() {
            return Ok(());
        }
        let rows = rows.min(self.max_batch());
        let vocab = self.config.vocab_size as u32;
        while self.batch.selects.len() + 1 < rows {
            let row = self.batch.selects.len() as u32 + 1;
            let select = Select::for_row(ctx, cache, &self.act.logits, vocab, row).await?;
            self.batch.selects.push(select);
        }
        let bytes = (rows * MAX_RESULT_BYTES) as u64;
        if rows > 1 && self.batch.staging.as_ref().is_none_or(|s| s.size() < bytes) {
            self.batch.staging = Some(ctx.staging_buffer("row select readback", bytes));
        }
        self.memory.batch = self.batch.bytes();
        Ok(())
    }

    /// Rows of a step that have a candidate selection (0 on a device without one).
    pub(super) fn batch_rows(&self) -> usize {
        match self.select {
            Some(_) => self.batch.selects.len() + 1,
            None => 0,
        }
    }

    /// Each row's selection paired with its request (row i with `requests[i]`), or `None`
    /// when some row has no selection (the device cannot run it, or
    /// [`Self::ensure_row_selects`] gave fewer rows).
    pub(super) fn row_selects<'a>(
        &'a self,
        requests: Vec<&'a SelectRequest>,
    ) -> Option<Vec<(&'a Select, &'a SelectRequest)>> {
        let first = self.select.as_ref()?;
        if requests.len() > self.batch.selects.len() + 1 {
            return None;
        }
        Some(
            std::iter::once(first)
                .chain(&self.batch.selects)
                .zip(requests)
                .collect(),
        )
    }

    /// Copies each row's selection result into a staging buffer, one after the other (each
    /// [`SelectRequest::result_bytes`] long); returns the buffer and the bytes to read.
    pub(super) fn copy_selected(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        selects: &[(&Select, &SelectRequest)],
    ) -> (&wgpu::Buffer, u64) {
        let staging = match &self.batch.staging {
            Some(staging) if selects.len() > 1 => staging,
            _ => &self.select_staging,
        };
        let mut end = 0;
        for (select, request) in selects {
            let bytes = request.result_bytes();
            encoder.copy_buffer_to_buffer(select.result(), 0, staging, end, bytes);
            end += bytes;
        }
        (staging, end)
    }

    /// One decode step for several sequences at once: `tokens[i]` at its position in its slot,
    /// all in one compute pass with one submit and one readback. With a request for every
    /// row (`requests[i]`) and a device that runs the selection, each row's candidates come
    /// back ([`StepLogits::Candidates`]); otherwise every row's logits ([`StepLogits::Full`]).
    /// Each sequence's keys go to its own slot and its attention reads only that slot.
    pub async fn decode_batch(
        &mut self,
        ctx: &GpuContext,
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
        let ids: Vec<u32> = tokens.iter().map(|t| t.token).collect();
        self.check_ids(&ids)?;
        let mut seen = vec![false; self.kv.slots()];
        let mut rows = Vec::with_capacity(n);
        for t in tokens {
            match seen.get_mut(t.slot) {
                None => {
                    return Err(Error::invalid(
                        "slot",
                        format!("{} is not one of the cache's {} slots", t.slot, seen.len()),
                    ))
                }
                Some(true) => {
                    return Err(Error::invalid(
                        "slot",
                        format!("slot {} appears twice in one step", t.slot),
                    ))
                }
                Some(s) => *s = true,
            }
            rows.push(StepRow::new(
                t.pos as u32,
                t.slot as u32,
                self.kv.slot_base(t.slot) as u32,
            ));
        }
        let params = StepParams::batched(&rows, self.chunk as u32, self.kv.context() as u32)?;
        let selects = requests
            .iter()
            .copied()
            .collect::<Option<Vec<&SelectRequest>>>()
            .and_then(|requests| self.row_selects(requests));
        let step = Step {
            label: "batched decode step",
            params: &params,
            rows: &rows,
            ids: &ids,
            head: StepHead::Batched,
        };
        match self.record(ctx, step, selects.as_deref()).await? {
            StepRead::Candidates(rows) => {
                Ok(rows.into_iter().map(StepLogits::Candidates).collect())
            }
            StepRead::Logits(all) => Ok(all
                .chunks(self.config.vocab_size)
                .map(|row| StepLogits::Full(row.to_vec()))
                .collect()),
            StepRead::Nothing => Err(Error::invalid("readback", "a batched step read nothing")),
        }
    }

    /// Copies positions `0..rows` of slot `from` into slots `to` (the samples of one prompt
    /// share its prefill), through a scratch cache of `rows` positions: rows are copied
    /// between buffers, never within one.
    pub fn copy_slot_prefix(
        &self,
        ctx: &GpuContext,
        from: usize,
        to: &[usize],
        rows: usize,
    ) -> Result<()> {
        if to.is_empty() || rows == 0 {
            return Ok(());
        }
        let slots = self.kv.slots();
        if let Some(bad) = std::iter::once(&from).chain(to).find(|&&s| s >= slots) {
            return Err(Error::invalid(
                "slot",
                format!("{bad} is not one of the cache's {slots} slots"),
            ));
        }
        if rows > self.kv.context() {
            return Err(Error::invalid(
                "rows",
                format!("{rows} is past the context of {}", self.kv.context()),
            ));
        }
        let layout = self.kv.layout().prefix(rows);
        let scratch = KvCache::with_layout(ctx, &self.config, layout, self.kv.kinds(), 1)?;
        KvCache::copy_positions(ctx, (&self.kv, from), (&scratch, 0), rows)?;
        for &slot in to {
            KvCache::copy_positions(ctx, (&scratch, 0), (&self.kv, slot), rows)?;
        }
        Ok(())
    }

    /// Reads back row `row` of the last step's logits (`[vocab]`): a batched step's sequence
    /// whose candidates did not suffice. One more submit and readback, no forward step.
    pub async fn logits_row(&self, ctx: &GpuContext, row: usize) -> Result<Vec<f32>> {
        if row >= self.chunk {
            return Err(Error::invalid(
                "row",
                format!("{row} is past the {} rows of a step", self.chunk),
            ));
        }
        let bytes = f32_bytes(self.config.vocab_size as u64);
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("logits row readback"),
            });
        encoder.copy_buffer_to_buffer(
            &self.act.logits,
            row as u64 * bytes,
            &self.staging,
            0,
            bytes,
        );
        ctx.counter_cells().submit(1);
        let submission = ctx.queue.submit([encoder.finish()]);
        let data = ctx.read_staging(&self.staging, bytes, submission).await?;
        Ok(bytemuck::pod_collect_to_vec(&data))
    }
}
