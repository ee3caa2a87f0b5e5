//! Loading onto the GPU: every buffer checked against the device's limits before anything is
//! allocated, then the weights uploaded in their stored format (1-D tensors as f32, fused
//! tensors in place of the ones they replace).

use std::collections::{BTreeMap, HashMap};

use super::Forward;
use crate::backend::gpu::buffer::LoadMemory;
use crate::backend::gpu::{GpuContext, GpuTensor};
use crate::dtype::{dequantize, encode_float, DType};
use crate::error::{Error, Result};
use crate::model::byte_source::{read_groups, TensorReader};
use crate::model::fuse::{self, FusionPlan};
use crate::model::weights::{ModelWeights, Tensor};

/// Bytes of `values` f32 values.
pub(super) fn f32_bytes(bytes: u64) -> u64 {
    bytes * 4
}

/// 1-D tensors (norm weights, biases) go to the GPU as f32 whatever their stored type, so the
/// small kernels read one format.
fn as_f32_tensor(name: &str, t: &Tensor<'_>) -> Result<Tensor<'static>> {
    let values = dequantize(t.dtype, &t.data, t.n_elements() as u64, name)?;
    Ok(Tensor {
        shape: t.shape.clone(),
        dtype: DType::F32,
        data: encode_float(DType::F32, &values)?.into(),
    })
}

/// A group of [`read_groups`] in an out-of-memory error: the tensor, or the layer.
fn group_name(layer: Option<usize>, names: &[String]) -> String {
    match (layer, names) {
        (_, [one]) => format!("tensor `{one}`"),
        (Some(l), _) => format!("layer {l}'s tensors"),
        (None, _) => format!("tensors {}", names.join(", ")),
    }
}

impl Forward {
    /// Checks every buffer the model will need against the device's limits before anything is
    /// allocated, so a model that cannot run fails at once with the numbers.
    pub(super) fn check_fits(
        ctx: &GpuContext,
        weights: &ModelWeights<'_>,
        context: usize,
        chunk: usize,
    ) -> Result<()> {
        let c = &weights.config;
        // an encoder's steps hold a whole text (see `step_tokens`)
        let chunk = crate::backend::step::step_tokens(c, context, chunk);
        let limit = ctx.binding_limit();
        for (name, t) in &weights.tensors {
            // a matrix larger than one binding is split by rows: one row must fit
            let bytes = match t.shape.as_slice() {
                [rows, _] if *rows > 0 => t.stored_len() / *rows as u64,
                _ => t.stored_len(),
            };
            if bytes > limit {
                return Err(Error::Limit {
                    what: format!("tensor `{name}` ({} {:?})", t.dtype, t.shape),
                    limit: "maxStorageBufferBindingSize",
                    needed: bytes,
                    allowed: limit,
                });
            }
        }
        let chunk = chunk as u64;
        // an encoder (bidirectional) has no LM head, so no logits rows
        let logits = match c.bidirectional {
            true => 0,
            false => c.vocab_size,
        };
        let widest = [
            c.hidden_size,
            c.q_dim() + 2 * c.kv_dim(),
            c.ffn_size,
            logits,
        ]
        .into_iter()
        .max()
        .unwrap_or(0) as u64;
        ctx.check_storage_size(
            "activations (chunk × widest layer)",
            f32_bytes(chunk * widest),
        )?;
        let kinds = ctx.options().kv_cache;
        let row = kinds
            .k
            .row_bytes(c.kv_dim())
            .max(kinds.v.row_bytes(c.kv_dim()));
        ctx.check_storage_size(
            "KV cache layer (context × kv_dim)",
            (context as u64).saturating_mul(row),
        )?;
        Ok(())
    }

    /// Uploads every tensor, replacing those that `plan` fuses by the fused ones (built one
    /// layer at a time, so at most one layer's copies exist at once).
    ///
    /// A layer's tensors (and its fused ones) are made inside one out-of-memory scope, each
    /// tensor outside the layers in its own ([`Error::OutOfMemory`] names them); on an error
    /// every buffer made so far is dropped with `out`.
    pub(super) async fn upload(
        ctx: &GpuContext,
        weights: &ModelWeights<'_>,
        plan: &FusionPlan,
        memory: LoadMemory,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<HashMap<String, GpuTensor>> {
        let mut out = HashMap::new();
        let total = weights.weight_bytes();
        let mut done = 0u64;
        progress(0, total);
        for (layer, names) in read_groups(weights) {
            let scope = memory.allocating(ctx, group_name(layer, &names));
            for name in &names {
                let Some(t) = weights.tensors.get(name) else {
                    continue;
                };
                Self::upload_one(ctx, name, t, plan, &mut out)?;
                done += t.data.len() as u64;
            }
            if let Some(layer) = layer.filter(|&l| l < weights.config.n_layers) {
                for (name, t) in fuse::fused_tensors(weights, plan, layer)? {
                    out.insert(name.clone(), GpuTensor::upload(ctx, &name, &t)?);
                }
            }
            scope.done(ctx).await?;
            progress(done, total);
        }
        progress(total, total);
        Ok(out)
    }

    /// Uploads tensor `name` as the GPU keeps it (1-D as f32), unless `plan` fuses it.
    fn upload_one(
        ctx: &GpuContext,
        name: &str,
        t: &Tensor<'_>,
        plan: &FusionPlan,
        out: &mut HashMap<String, GpuTensor>,
    ) -> Result<()> {
        if plan.replaced(name) {
            return Ok(());
        }
        let t = if t.shape.len() == 1 && t.dtype != DType::F32 {
            as_f32_tensor(name, t)?
        } else {
            t.clone()
        };
        out.insert(name.to_string(), GpuTensor::upload(ctx, name, &t)?);
        Ok(())
    }

    /// [`Forward::upload`] for a model described by `layout` (tensors without bytes) whose
    /// tensors `reader` reads: a layer's tensors together (its fused tensors need every part),
    /// the others one at a time, each group's bytes dropped once it is on the GPU. Also gives
    /// the 1-D tensors outside the layers (the final norm's), which the host keeps. Each
    /// group's buffers are made inside an out-of-memory scope, as in [`Forward::upload`].
    pub(super) async fn upload_read(
        ctx: &GpuContext,
        layout: &ModelWeights<'_>,
        reader: &dyn TensorReader,
        plan: &FusionPlan,
        memory: LoadMemory,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(HashMap<String, GpuTensor>, ModelWeights<'static>)> {
        let with = |tensors: BTreeMap<String, Tensor<'static>>| ModelWeights {
            file: layout.file.clone(),
            config: layout.config.clone(),
            tensors,
            sources: Vec::new(),
            later_files: layout.later_files.clone(),
            later_tensors: layout.later_tensors.clone(),
        };
        let mut out = HashMap::new();
        let mut kept = BTreeMap::new();
        let total = layout.weight_bytes();
        let mut done = 0u64;
        progress(0, total);
        for (layer, names) in read_groups(layout) {
            let group = with(reader.read_tensors(&names).await?);
            let scope = memory.allocating(ctx, group_name(layer, &names));
            for (name, t) in &group.tensors {
                Self::upload_one(ctx, name, t, plan, &mut out)?;
            }
            if let Some(layer) = layer.filter(|&l| l < layout.config.n_layers) {
                for (name, t) in fuse::fused_tensors(&group, plan, layer)? {
                    out.insert(name.clone(), GpuTensor::upload(ctx, &name, &t)?);
                }
            }
            scope.done(ctx).await?;
            done = done.saturating_add(group.weight_bytes());
            progress(done.min(total), total);
            if layer.is_none() {
                kept.extend(
                    group
                        .tensors
                        .into_iter()
                        .filter(|(_, t)| t.shape.len() == 1),
                );
            }
        }
        progress(total, total);
        Ok((out, with(kept)))
    }
}
