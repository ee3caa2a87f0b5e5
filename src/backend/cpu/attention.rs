//! Attention on the CPU (causal, or for an encoder over the whole text: each token's key range
//! says which), a tile of query tokens and heads at a time.
//!
//! A job takes the tokens of a prefill chunk that share a cache (up to [`TILE`] of them) and a
//! key/value head's query heads, and reads each key and value row once for all of them, where
//! a job per token and head read every row again for each: at 4,096 positions the rows of a
//! layer no longer fit the cache, and the step was bound by reading them. Where there are
//! fewer such jobs than threads (a decode step of a model with few key/value heads on many
//! threads), a job is one token's one head. A decode step at length ([`split::FROM`] keys and
//! more) is split further, over runs of positions and of the head's values ([`split`]).
//!
//! Every score, softmax and weighted sum is computed in the order and with the operations of
//! one token's one head over the positions in order (eight-lane dot products,
//! [`crate::math::softmax_exp`], products added one position after another), so the result
//! has the same bits whatever the tiling, natively and in WebAssembly. On x86-64 with AVX2 the same code is compiled for
//! 256-bit registers (without FMA, which would round differently), picked at run time.

mod split;

use std::ops::Range;

use super::dot::dot_f32;
use super::kv::{KeyRange, KvRows};

/// Shapes of an attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (query head `h` reads `h / (n_heads / n_kv_heads)`).
    pub n_kv_heads: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Distance between two tokens' queries in `q` (`q_dim`, or `q_dim + 2·kv_dim` stacked).
    pub q_stride: usize,
    /// Factor on the scores beyond `1/√head_dim` (YaRN's attention factor squared; 1).
    pub score_scale: f32,
}

impl AttnShape {
    /// Query heads per key/value head.
    fn group(&self) -> usize {
        (self.n_heads / self.n_kv_heads.max(1)).max(1)
    }

    /// The factor on a query's dot product with a key: `score_scale / √head_dim`.
    fn scale(&self) -> f32 {
        (f64::from(self.score_scale) / (self.head_dim as f64).sqrt()) as f32
    }
}

/// Query tokens that share each key and value row a job reads.
const TILE: usize = 16;

/// What every job of one call reads: the queries, the caches, each token's keys and the shapes.
struct Inputs<'a> {
    q: &'a [f32],
    k: &'a KvRows,
    v: &'a KvRows,
    keys: &'a [KeyRange],
    s: AttnShape,
}

/// What one job attends: `tokens` (consecutive, sharing one cache's rows) and the query
/// `heads` (consecutive, of one key/value head).
struct Job {
    tokens: Range<usize>,
    heads: Range<usize>,
}

/// The most scores one job holds (4 MiB of f32): a tile's tokens × heads × key positions.
const MAX_SCORES: usize = 1 << 20;

/// Runs of at most `tile` consecutive tokens whose keys lie in the same cache rows (the same
/// slot and ring): a prefill chunk's tokens, or each sequence's token of a batched step.
fn token_tiles(keys: &[KeyRange], tile: usize) -> Vec<Range<usize>> {
    let mut tiles: Vec<Range<usize>> = Vec::new();
    for (t, r) in keys.iter().enumerate() {
        match tiles.last_mut() {
            Some(last)
                if last.len() < tile
                    && (keys[last.start].base, keys[last.start].ring) == (r.base, r.ring) =>
            {
                last.end = t + 1
            }
            _ => tiles.push(t..t + 1),
        }
    }
    tiles
}

/// Attention over each token's key range: for token `t`, query heads `q[t·q_stride ..][..n_heads·head_dim]` over
/// the cache rows `keys[t]` (`k`, `v`: rows of `kv_dim` in any cache kind, decoded a head at a
/// time as they are read), scaled by `score_scale/√head_dim`, into
/// `out: [tokens, n_heads·head_dim]`. Jobs (see the [module docs](self)) are spread over the
/// thread team.
pub fn attention(
    q: &[f32],
    k: &KvRows,
    v: &KvRows,
    keys: &[KeyRange],
    s: AttnShape,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let group = s.group();
    // fewer tokens a tile where the keys are many, so that a job's scores stay bounded (each
    // thread holds one job's)
    let longest = keys.iter().map(KeyRange::len).max().unwrap_or(0);
    let tile = (MAX_SCORES / (group * longest).max(1)).clamp(1, TILE);
    let tiles = token_tiles(keys, tile);
    if tiles.len() == keys.len()
        && longest >= split::FROM
        && keys.len() * s.n_heads * (longest + 1) <= split::MAX_SCORES
    {
        // a token a tile at length (a decode step): split over positions and values
        split::attention(q, k, v, keys, s, out);
        return;
    }
    // a key/value head's whole group where that leaves every thread a job (its rows are then
    // read once, not once per head: a decode step at length is bound by reading them), else
    // one head a job
    let per_job = match tiles.len() * (s.n_heads / group) >= super::threads() {
        true => group,
        false => 1,
    };
    let blocks = s.n_heads / per_job;
    let widest = tiles.iter().map(Range::len).max().unwrap_or(0);
    let job_len = widest * per_job * hd;
    if job_len == 0 {
        return;
    }
    let inputs = Inputs { q, k, v, keys, s };
    let run = |i: usize, o: &mut [f32]| {
        let block = i % blocks;
        let job = Job {
            tokens: tiles[i / blocks].clone(),
            heads: block * per_job..(block + 1) * per_job,
        };
        attend(&inputs, &job, o);
    };
    if widest == 1 {
        // a token a tile (a decode step): each job's rows are its own stretch of `out`
        super::for_each_chunk(out, job_len, run);
        return;
    }
    let mut scratch = vec![0.0f32; tiles.len() * blocks * job_len];
    super::for_each_chunk(&mut scratch, job_len, run);
    // each job's rows, token by token and head by head, to their places in `out`
    for (ti, tile) in tiles.iter().enumerate() {
        for (j, t) in tile.clone().enumerate() {
            for block in 0..blocks {
                let from = (ti * blocks + block) * job_len + j * per_job * hd;
                let to = t * s.n_heads * hd + block * per_job * hd;
                let n = per_job * hd;
                out[to..to + n].copy_from_slice(&scratch[from..from + n]);
            }
        }
    }
}

/// One job, on the widest registers this CPU has.
fn attend(inputs: &Inputs<'_>, job: &Job, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::dot::has_avx2() {
        // SAFETY: the CPU has AVX2 (checked above).
        unsafe { attend_avx2(inputs, job, out) };
        return;
    }
    attend_with(inputs, job, out);
}

/// [`attend_with`] compiled for AVX2 (its loops in 256-bit registers; no FMA).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn attend_avx2(inputs: &Inputs<'_>, job: &Job, out: &mut [f32]) {
    attend_with(inputs, job, out)
}

/// One job: the scores of every (token, head) of `job` against each key row read once, the
/// softmax of each, then the value rows read once into the weighted sums. `out` holds the
/// job's rows, token by token and, within a token, head by head (`[tokens, heads, head_dim]`).
#[inline(always)]
fn attend_with(inputs: &Inputs<'_>, job: &Job, out: &mut [f32]) {
    let Inputs { q, k, v, keys, s } = inputs;
    let hd = s.head_dim;
    let group = s.group();
    let scale = s.scale();
    let off = (job.heads.start / group) * hd;
    let ranges: Vec<&KeyRange> = job.tokens.clone().map(|t| &keys[t]).collect();
    let Some(first) = ranges.first().copied() else {
        return;
    };
    let lo = ranges.iter().map(|r| r.first).min().unwrap_or(0);
    let hi = ranges.iter().map(|r| r.end).max().unwrap_or(0);
    let span = hi.saturating_sub(lo);
    let heads = job.heads.len();
    // scores[(j·heads + h)·span + (p − lo)]: token j's head h at position p
    let mut scores = vec![0.0f32; ranges.len() * heads * span];
    let mut buf = vec![0.0f32; hd];
    for p in lo..hi {
        let kr = k.span(first.row(p), off, &mut buf);
        for (j, r) in ranges.iter().enumerate() {
            if p < r.first || p >= r.end {
                continue;
            }
            let t = job.tokens.start + j;
            for (hi_, h) in job.heads.clone().enumerate() {
                let qh = &q[t * s.q_stride + h * hd..][..hd];
                scores[(j * heads + hi_) * span + (p - lo)] = dot_f32(qh, kr) * scale;
            }
        }
    }
    // each (token, head)'s softmax over its own positions, in position order
    let mut sums = vec![0.0f32; ranges.len() * heads];
    for (j, r) in ranges.iter().enumerate() {
        for h in 0..heads {
            let row = &mut scores[(j * heads + h) * span..][..span];
            let own = &mut row[r.first - lo..r.end - lo];
            let max = own.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            // the exponentials a loop of SIMD lanes, then their sum in position order
            for x in own.iter_mut() {
                *x = crate::math::softmax_exp(*x - max);
            }
            sums[j * heads + h] = own.iter().fold(0.0f32, |sum, &x| sum + x);
        }
    }
    out.fill(0.0);
    for p in lo..hi {
        let vr = v.span(first.row(p), off, &mut buf);
        for (j, r) in ranges.iter().enumerate() {
            if p < r.first || p >= r.end {
                continue;
            }
            for h in 0..heads {
                let w = scores[(j * heads + h) * span + (p - lo)];
                let o = &mut out[(j * heads + h) * hd..][..hd];
                for (a, &b) in o.iter_mut().zip(vr) {
                    *a += w * b;
                }
            }
        }
    }
    for (i, &sum) in sums.iter().enumerate() {
        let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
        out[i * hd..][..hd].iter_mut().for_each(|a| *a *= inv);
    }
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
