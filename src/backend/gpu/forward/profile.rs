//! Where a step's time goes: every node of the graph timed alone, grouped by kernel.
//!
//! Each distinct (kernel, variant, shape) of the step is dispatched alone in batches until a
//! batch takes long enough for the wall clock (timestamp queries are not needed: they are
//! optional on WebGPU, and batches rank kernels on every adapter), then multiplied by how many
//! times the step runs it. The whole step is timed too, so the sum of the parts can be checked
//! against it (the difference is what one dispatch after another costs beyond its work).

use std::collections::BTreeMap;

use serde::Serialize;
use web_time::Duration;

use super::{Forward, Node};
use crate::backend::gpu::ops::LinearBinding;
use crate::backend::gpu::plan::Family;
use crate::backend::gpu::{GpuContext, KernelPlan, StepParams, Variant};
use crate::error::{Error, Result};

/// A batch that takes at least this long is timed well enough.
const MIN_BATCH: Duration = Duration::from_millis(20);
/// Most repetitions of one batch.
const MAX_REPS: u32 = 512;

/// One kernel of a profiled step: every node of the same kernel, variant and shape together.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileRow {
    /// The kernel group: `linear qkv+norm+rope+kv_write`, `attention`, `embedding`, `lm_head`.
    pub kernel: String,
    /// The shape (`[960, 576] Q4_1`) or label of the bound kernel.
    pub shape: String,
    /// The variant it ran in, for families that have variants.
    pub variant: Option<Variant>,
    /// Dispatches of it per step.
    pub count: usize,
    /// Seconds it takes per step (all its dispatches).
    pub seconds: f64,
    /// Bytes of model weights and KV cache it reads per step (activations not counted).
    pub bytes: u64,
}

/// The profile of one step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepProfile {
    /// Tokens in the step (1: decode; a chunk: prefill).
    pub n_tokens: u32,
    /// Position of its first token.
    pub pos0: u32,
    /// Every kernel, slowest first.
    pub rows: Vec<ProfileRow>,
    /// Sum of the rows' seconds.
    pub kernels_seconds: f64,
    /// The whole step (every node in one pass, one submit), timed the same way.
    pub step_seconds: f64,
}

/// One decode step and one prefill chunk, profiled, with the plan they ran under.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
    /// The kernel plan of the model.
    pub plan: KernelPlan,
    /// One token at the profiled position.
    pub decode: StepProfile,
    /// One chunk of prefill starting at position 0.
    pub prefill: StepProfile,
}

/// A node to time, with what it is.
struct Item<'a> {
    node: Timed<'a>,
    kernel: String,
    shape: String,
    variant: Option<Variant>,
    bytes: u64,
}

/// (kernel, shape, variant): what profile rows are grouped by.
type GroupKey = (String, String, Option<Variant>);

#[derive(Clone, Copy)]
enum Timed<'a> {
    Node(&'a Node),
    Head(&'a LinearBinding),
}

impl Forward {
    /// Profiles a decode step at position `decode_pos` (after that many cached tokens) and a
    /// prefill chunk of `prompt_tokens` (at most the chunk) at position 0. The KV cache's
    /// contents are not read for meaning: the model must be reset (`truncate(0)`) afterwards,
    /// which this does.
    pub async fn profile(
        &mut self,
        ctx: &GpuContext,
        decode_pos: u32,
        prompt_tokens: u32,
    ) -> Result<Profile> {
        let context = self.kv.context() as u32;
        if decode_pos >= context {
            return Err(Error::invalid(
                "decode_pos",
                format!("must be below the context of {context}, got {decode_pos}"),
            ));
        }
        let max_chunk = (self.chunk as u32).min(context);
        if prompt_tokens == 0 || prompt_tokens > max_chunk {
            return Err(Error::invalid(
                "prompt_tokens",
                format!("must be in 1..={max_chunk} (one chunk), got {prompt_tokens}"),
            ));
        }
        let decode = self.profile_step(ctx, decode_pos, 1).await?;
        let prefill = self.profile_step(ctx, 0, prompt_tokens).await?;
        self.truncate(0)?;
        Ok(Profile {
            plan: self.plan.clone(),
            decode,
            prefill,
        })
    }

    async fn profile_step(&self, ctx: &GpuContext, pos0: u32, n: u32) -> Result<StepProfile> {
        let head_last = self
            .head_last
            .as_ref()
            .ok_or_else(|| crate::model::graph::no_lm_head(&self.config))?;
        let params = StepParams::new(pos0, n);
        params.write(ctx, &self.step);
        let c = &self.config;
        let kv_bytes = 2 * u64::from(pos0 + n) * c.kv_dim() as u64 * 4;
        let plan = &self.plan;
        let family = if n == 1 {
            Family::LinearDecode
        } else {
            Family::LinearPrefill
        };
        let mut items: Vec<Item<'_>> = Vec::new();
        for node in &self.nodes {
            let item = match node {
                Node::Kernel(k) => Item {
                    node: Timed::Node(node),
                    kernel: k.label().split(' ').next().unwrap_or("kernel").to_string(),
                    shape: k.label().to_string(),
                    variant: None,
                    bytes: k.weight_bytes(n),
                },
                Node::Parts(parts) => {
                    let label = parts.first().map_or("kernel", |k| k.label());
                    Item {
                        node: Timed::Node(node),
                        kernel: label.split(' ').next().unwrap_or("kernel").to_string(),
                        shape: format!("{label} in {} parts", parts.len()),
                        variant: None,
                        bytes: parts.iter().map(|k| k.weight_bytes(n)).sum(),
                    }
                }
                Node::Linear(l) => {
                    let (rows, cols) = l.shape();
                    Item {
                        node: Timed::Node(node),
                        kernel: format!("linear {}", l.kind()),
                        shape: format!("[{rows}, {cols}]"),
                        variant: Some(plan.variant(family)),
                        bytes: l.weight_bytes(),
                    }
                }
                Node::Attention(built) => {
                    let label = built.first().map(|(_, k)| k.label()).unwrap_or("kernel");
                    let splits = built.first().map_or(1, |(_, k)| k.splits(&params));
                    let shape = if splits > 1 {
                        format!("{} heads × {n} tokens, {splits} key splits", c.n_heads)
                    } else {
                        format!("{} heads × {n} tokens", c.n_heads)
                    };
                    Item {
                        node: Timed::Node(node),
                        kernel: label.to_string(),
                        shape,
                        variant: Some(plan.variant(Family::Attention)),
                        bytes: kv_bytes,
                    }
                }
            };
            items.push(item);
        }
        // the LM head runs on the step's last token only
        let (rows, cols) = head_last.shape();
        items.push(Item {
            node: Timed::Head(head_last),
            kernel: format!("linear {}", head_last.kind()),
            shape: format!("[{rows}, {cols}]"),
            variant: Some(plan.variant(Family::LinearDecode)),
            bytes: head_last.weight_bytes(),
        });
        let mut groups: BTreeMap<GroupKey, (Timed<'_>, usize, u64)> = BTreeMap::new();
        for item in items {
            let e = groups
                .entry((item.kernel, item.shape, item.variant))
                .or_insert((item.node, 0, 0));
            e.1 += 1;
            e.2 += item.bytes;
        }
        let mut rows = Vec::new();
        for ((kernel, shape, variant), (node, count, bytes)) in groups {
            let once = self
                .time_batches(ctx, &|pass| self.record_timed(pass, node, &params))
                .await?;
            rows.push(ProfileRow {
                kernel,
                shape,
                variant,
                count,
                seconds: once * count as f64,
                bytes,
            });
        }
        rows.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        let step_seconds = self
            .time_batches(ctx, &|pass| {
                for node in &self.nodes {
                    node.record(pass, &params, plan);
                }
                head_last.record_planned(pass, n, plan.linear());
            })
            .await?;
        Ok(StepProfile {
            n_tokens: n,
            pos0,
            kernels_seconds: rows.iter().map(|r| r.seconds).sum(),
            rows,
            step_seconds,
        })
    }

    fn record_timed(&self, pass: &mut wgpu::ComputePass<'_>, node: Timed<'_>, params: &StepParams) {
        match node {
            Timed::Node(node) => node.record(pass, params, &self.plan),
            Timed::Head(head) => head.record_planned(pass, params.n_tokens, self.plan.linear()),
        }
    }

    /// Seconds per run of `record`, from batches grown until one takes [`MIN_BATCH`].
    async fn time_batches(
        &self,
        ctx: &GpuContext,
        record: &dyn Fn(&mut wgpu::ComputePass<'_>),
    ) -> Result<f64> {
        // warm-up
        self.run_batch(ctx, 1, record).await?;
        let mut reps = 1u32;
        loop {
            let elapsed = self.run_batch(ctx, reps, record).await?;
            if elapsed >= MIN_BATCH || reps >= MAX_REPS {
                return Ok(elapsed.as_secs_f64() / f64::from(reps));
            }
            let scale = (MIN_BATCH.as_secs_f64() / elapsed.as_secs_f64().max(1e-6)).ceil();
            reps = (f64::from(reps) * scale.clamp(2.0, 16.0)).min(f64::from(MAX_REPS)) as u32;
        }
    }
}
