//! One step of the CPU forward pass: the graph's operations in order over this step's
//! activations, each token at its own position and KV slot.

use super::{CpuForward, CpuKv, CpuWeights};
use crate::backend::cpu::ops::{self, AttnShape, KeyRange};
use crate::backend::readback::Head;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::model::graph::{Act, EmbedScale, LinearOp, Norm, Op, Post, Rows};

/// Where one token of a step goes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Row {
    /// Its position in its sequence.
    pub pos: usize,
    /// Its sequence's KV slot.
    pub slot: usize,
}

/// The step's activations, `[tokens, width]` each (widths as [`Act`] says).
#[derive(Debug, Default)]
struct Acts {
    x: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    hidden: Vec<f32>,
    branch: Vec<f32>,
    logits: Vec<f32>,
}

impl Acts {
    fn get(&mut self, act: Act) -> &mut Vec<f32> {
        match act {
            Act::X => &mut self.x,
            Act::Q => &mut self.q,
            Act::K => &mut self.k,
            Act::V => &mut self.v,
            Act::Attn => &mut self.attn,
            Act::Gate => &mut self.gate,
            Act::Up => &mut self.up,
            Act::Hidden => &mut self.hidden,
            Act::Branch => &mut self.branch,
            // ids are never f32 activations; the graph does not read them as such
            Act::Ids | Act::Logits => &mut self.logits,
        }
    }
}

impl CpuForward {
    /// Runs the graph for `ids` (token `i` at `rows[i]`) and leaves the logits `head` asks
    /// for in `self.logits`.
    pub(super) fn step(&mut self, ids: &[u32], rows: &[Row], head: Head) -> Result<()> {
        crate::backend::cpu::run(|| self.step_here(ids, rows, head))
    }

    /// [`Self::step`] on the calling thread.
    fn step_here(&mut self, ids: &[u32], rows: &[Row], head: Head) -> Result<()> {
        let Self {
            config,
            graph,
            weights,
            kv,
            freqs,
            logits,
            ..
        } = self;
        let mut a = Acts::default();
        let n = ids.len();
        for op in &graph.ops {
            match op {
                Op::Embed {
                    table,
                    rows: which,
                    accumulate,
                    scale,
                } => {
                    let m = mat(weights, table)?;
                    let d = m.cols();
                    let mul = match scale {
                        EmbedScale::One => 1.0,
                        EmbedScale::SqrtDim => (config.hidden_size as f32).sqrt(),
                    };
                    a.x.resize(n * d, 0.0);
                    let mut row = vec![0.0f32; d];
                    for (i, x) in a.x.chunks_exact_mut(d).enumerate() {
                        let r = match which {
                            Rows::Tokens => ids[i] as usize,
                            Rows::Positions => rows[i].pos,
                            Rows::First => 0,
                        };
                        m.row_f32(r, &mut row)?;
                        for (x, &e) in x.iter_mut().zip(&row) {
                            *x = if *accumulate { *x + e * mul } else { e * mul };
                        }
                    }
                }
                Op::Linear(l) => {
                    let out = linear(config, weights, &mut a, l, n)?;
                    *a.get(l.y) = out;
                    if let Some(layer) = l.kv_layer {
                        let (q, kvd) = (config.q_dim(), config.kv_dim());
                        let width = q + 2 * kvd;
                        for (t, r) in a.q.chunks_exact_mut(width).zip(rows) {
                            let (qs, rest) = t.split_at_mut(q);
                            let (ks, vs) = rest.split_at_mut(kvd);
                            rope_token(config, &freqs[layer], r.pos, qs, ks);
                            write_kv(kv, layer, r, ks, vs, kvd);
                        }
                    }
                }
                Op::RopeKvWrite { layer } => {
                    let (q, kvd) = (config.q_dim(), config.kv_dim());
                    for (i, r) in rows.iter().enumerate() {
                        let qs = &mut a.q[i * q..][..q];
                        let ks = &mut a.k[i * kvd..][..kvd];
                        rope_token(config, &freqs[*layer], r.pos, qs, ks);
                        write_kv(kv, *layer, r, ks, &a.v[i * kvd..][..kvd], kvd);
                    }
                }
                Op::Attention { layer, stacked } => {
                    let (q, kvd) = (config.q_dim(), config.kv_dim());
                    let window = config.layer_window(*layer).map(|w| w as usize);
                    let ring = kv.layout.ring(*layer).unwrap_or(0);
                    // bidirectional: every position of the text, its sequence's latest in the
                    // step (one sequence: a text runs whole, from position 0)
                    let text_end = match config.bidirectional {
                        true => last_pos(rows) + 1,
                        false => 0,
                    };
                    let keys: Vec<KeyRange> = rows
                        .iter()
                        .map(|r| {
                            let end = match config.bidirectional {
                                true => text_end,
                                false => r.pos + 1,
                            };
                            KeyRange {
                                first: window.map_or(0, |w| end.saturating_sub(w)),
                                end,
                                base: kv.layout.row(*layer, r.slot, 0),
                                ring,
                            }
                        })
                        .collect();
                    let shape = AttnShape {
                        n_heads: config.n_heads,
                        n_kv_heads: config.n_kv_heads,
                        head_dim: config.head_dim,
                        q_stride: if *stacked { q + 2 * kvd } else { q },
                        score_scale: config.layer_score_scale(*layer),
                    };
                    a.attn.resize(n * q, 0.0);
                    let (k, v) = (&kv.k[*layer], &kv.v[*layer]);
                    match crate::backend::cpu::kv::decode_keys(k, v, &keys) {
                        // an encoded cache: the step's rows decoded once
                        Some((k, v, keys)) => {
                            ops::attention(&a.q, &k, &v, &keys, shape, &mut a.attn)
                        }
                        None => ops::attention(&a.q, k, v, &keys, shape, &mut a.attn),
                    }
                }
                Op::SwiGlu | Op::GeGlu => {
                    let f = match op {
                        Op::SwiGlu => ops::silu,
                        _ => ops::gelu_tanh,
                    };
                    a.hidden.resize(a.gate.len(), 0.0);
                    let (gate, up) = (&a.gate, &a.up);
                    // spread over the team: a prompt chunk's FFN activations are large
                    crate::backend::cpu::for_each_chunk(&mut a.hidden, GLU_CHUNK, |i, h| {
                        let at = i * GLU_CHUNK;
                        for ((h, &g), &u) in h.iter_mut().zip(&gate[at..]).zip(&up[at..]) {
                            *h = f(g) * u;
                        }
                    });
                }
                Op::HeadNorm { act, weight } => {
                    let w = vec_of(weights, weight)?;
                    let x = a.get(*act);
                    let input = x.clone();
                    ops::rms_norm(&input, w, config.norm_eps, x);
                }
                Op::Norm(norm) => {
                    a.x = normed(config, weights, &a.x[..n * config.hidden_size], norm)?;
                }
                Op::AddNormed { weight } => {
                    let w = vec_of(weights, weight)?;
                    let mut normed = vec![0.0f32; a.branch.len()];
                    ops::rms_norm(&a.branch, w, config.norm_eps, &mut normed);
                    for (x, y) in a.x.iter_mut().zip(&normed) {
                        *x += y;
                    }
                }
            }
        }
        match head {
            Head::None => logits.clear(),
            Head::All => *logits = linear(config, weights, &mut a, graph.lm_head(config)?, n)?,
            Head::Last => {
                let d = config.hidden_size;
                a.x.drain(..(n - 1) * d);
                *logits = linear(config, weights, &mut a, graph.lm_head(config)?, 1)?;
            }
            Head::Hidden => {
                let x = &a.x[..n * config.hidden_size];
                *logits = match graph.head.as_ref().and_then(|h| h.norm.as_ref()) {
                    Some(norm) => normed(config, weights, x, norm)?,
                    None => x.to_vec(),
                };
            }
        }
        Ok(())
    }
}

/// Values per task of the gated activation.
const GLU_CHUNK: usize = 16 * 1024;

fn mat<'w>(w: &'w CpuWeights, name: &str) -> Result<&'w crate::backend::cpu::QMatrix> {
    w.mats
        .get(name)
        .ok_or_else(|| Error::invalid("tensor", format!("`{name}` is not a matrix")))
}

fn vec_of<'w>(w: &'w CpuWeights, name: &str) -> Result<&'w [f32]> {
    w.vecs
        .get(name)
        .map(Vec::as_slice)
        .ok_or_else(|| Error::invalid("tensor", format!("`{name}` is not a vector")))
}

/// `post(W · norm(x) + b)` for `l`, over `n` tokens; added to the current output when the op
/// accumulates.
fn linear(
    c: &ModelConfig,
    w: &CpuWeights,
    a: &mut Acts,
    l: &LinearOp,
    n: usize,
) -> Result<Vec<f32>> {
    let m = mat(w, &l.matrix.weight)?;
    let bias = l.matrix.bias.as_deref().map(|b| vec_of(w, b)).transpose()?;
    let x = a.get(l.x);
    let x = &x[..n * m.cols()];
    let held;
    let input: &[f32] = match &l.norm {
        None => x,
        Some(norm) => {
            held = normed(c, w, x, norm)?;
            &held
        }
    };
    let mut y = vec![0.0f32; n * m.rows()];
    m.matmul(input, bias, &mut y);
    let y = match l.post {
        Post::None => y,
        Post::Gelu => y.into_iter().map(ops::gelu_tanh).collect(),
        Post::GeluErf => y.into_iter().map(ops::gelu_erf).collect(),
        Post::SwiGlu | Post::GeGlu => {
            let f = match l.post {
                Post::SwiGlu => ops::silu,
                _ => ops::gelu_tanh,
            };
            y.chunks_exact(2).map(|p| f(p[0]) * p[1]).collect()
        }
    };
    if !l.accumulate {
        return Ok(y);
    }
    let mut out = std::mem::take(a.get(l.y));
    for (o, v) in out.iter_mut().zip(&y) {
        *o += v;
    }
    Ok(out)
}

/// `norm` of every row of `x` (`[tokens, d]`), a new `[tokens, d]`.
fn normed(c: &ModelConfig, w: &CpuWeights, x: &[f32], norm: &Norm) -> Result<Vec<f32>> {
    let g = vec_of(w, &norm.weight)?;
    let bias = norm.bias.as_deref().map(|b| vec_of(w, b)).transpose()?;
    let mut out = vec![0.0f32; x.len()];
    ops::norm(norm.kind, x, g, bias, c.norm_eps, &mut out);
    Ok(out)
}

/// RoPE on one token's queries and keys at `pos`.
fn rope_token(c: &ModelConfig, freqs: &[f64], pos: usize, q: &mut [f32], k: &mut [f32]) {
    ops::rope(q, c.head_dim, pos, freqs, c.rope_layout);
    ops::rope(k, c.head_dim, pos, freqs, c.rope_layout);
}

/// The latest position of the step's tokens (a bidirectional model's tokens, one text of one
/// sequence, read its keys up to it).
fn last_pos(rows: &[Row]) -> usize {
    rows.iter().map(|r| r.pos).max().unwrap_or(0)
}

/// Writes one token's key and value rows into `layer`'s cache.
fn write_kv(kv: &mut CpuKv, layer: usize, r: &Row, k: &[f32], v: &[f32], kvd: usize) {
    let row = kv.layout.row(layer, r.slot, r.pos);
    kv.k[layer].write(row, &k[..kvd]);
    kv.v[layer].write(row, &v[..kvd]);
}
