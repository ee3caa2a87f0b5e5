//! A decode step's attention at length, split over positions and over the head dimension so
//! that every thread has work whatever the number of key/value heads, with the bits of one
//! token's one head over the positions in order (the parent module's contract).
//!
//! A job per key/value head leaves threads idle where the heads do not divide among them
//! (SmolLM2's three on two threads: a third of the step on one thread), and at length a job
//! is a long walk over one head's rows. Here a step is three passes, each spread over the
//! thread team:
//!
//! 1. **Scores**, a job per token, key/value head and run of [`POSITIONS`] positions: each key
//!    row read once for the head's group of query heads. A score depends on its position
//!    alone, so cutting the positions changes no bit.
//! 2. **Softmax**, a job per token and query head: the maximum (exact in any order), the
//!    exponentials, and their sum in position order.
//! 3. **Weighted sums**, a job per token, key/value head and run of [`DIMS`] values of the
//!    head: each value row's run read once for the group, the products added one position
//!    after another, the group's sums held in registers across the positions. Each output
//!    value is added up in position order as before; cutting the head dimension changes no
//!    bit either.

use super::{AttnShape, KvRows};
use crate::backend::cpu::dot::dot_f32;
use crate::backend::cpu::kv::KeyRange;

/// Positions per scores job.
pub(super) const POSITIONS: usize = 256;

/// Values of a head per weighted-sums job (two AVX2 registers, or one AVX-512 register, a
/// query head).
const DIMS: usize = 16;

/// Query heads whose sums one pass over a run of value rows keeps (four heads × [`DIMS`]).
const HEADS: usize = 4;

/// Rows ahead of the one read whose stretch is prefetched (rows a head's stretch apart are
/// strided, which the CPU's own prefetch follows poorly: without it, the scores' pass waited on
/// the rows for most of its time).
const AHEAD: usize = 16;

/// The longest key range from which a decode step is split this way: shorter ones cost more in
/// the two extra passes' waits than they gain.
pub(super) const FROM: usize = 512;

/// The most scores a split step holds (32 MiB of f32: a token's 32 heads at 256K positions, or
/// 16 tokens' at 16K); past it (a prefill chunk whose tiles were cut to one token by their
/// length) the jobs of one key/value head each hold their own, bounded, scores instead.
pub(super) const MAX_SCORES: usize = 1 << 23;

/// What the three passes read.
struct Step<'a> {
    q: &'a [f32],
    k: &'a KvRows,
    v: &'a KvRows,
    keys: &'a [KeyRange],
    s: AttnShape,
    /// Query heads per key/value head.
    group: usize,
    /// Scores per (token, query head) row: the longest range, plus one for the row's sum.
    stride: usize,
}

/// Attention of `keys.len()` tokens of one position each (a decode step, or a batched one's
/// slots), with the arguments of [`super::attention`].
pub(super) fn attention(
    q: &[f32],
    k: &KvRows,
    v: &KvRows,
    keys: &[KeyRange],
    s: AttnShape,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let group = s.group();
    let kv_heads = s.n_heads / group;
    let longest = keys.iter().map(KeyRange::len).max();
    let stride = longest.unwrap_or(0) + 1;
    let step = Step {
        q,
        k,
        v,
        keys,
        s,
        group,
        stride,
    };
    // scores[(t·n_heads + h)·stride + i]: token t's head h at its range's i-th position; the
    // row's last value is its sum
    let mut scores = vec![0.0f32; keys.len() * s.n_heads * stride];
    // pass 1: each job's (token, key/value head, run) written through a shared pointer, as its
    // rows are strided (a job writes `group` runs of at most POSITIONS scores, no two jobs the
    // same ones)
    let runs = stride.div_ceil(POSITIONS).max(1);
    let base = SharedScores(scores.as_mut_ptr(), scores.len());
    let score_job = |i: usize| {
        let (t, rest) = (i / (kv_heads * runs), i % (kv_heads * runs));
        let (g, run) = (rest / runs, rest % runs);
        step.scores(t, g, run, &base);
    };
    if !crate::backend::cpu::team::split(keys.len() * kv_heads * runs, &score_job) {
        (0..keys.len() * kv_heads * runs).for_each(score_job);
    }
    // pass 2: each row's softmax in place, its sum in the row's last value
    crate::backend::cpu::for_each_chunk(&mut scores, stride, |i, row| {
        let n = keys[i / s.n_heads].len();
        let (own, sum) = row.split_at_mut(stride - 1);
        let own = &mut own[..n];
        let max = own.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        for x in own.iter_mut() {
            *x = crate::math::softmax_exp(*x - max);
        }
        sum[0] = own.iter().fold(0.0f32, |sum, &x| sum + x);
    });
    // pass 3: each (token, key/value head, run of values) job's sums, [group, DIMS], then
    // put in place divided by their rows' sums
    let chunks = hd.div_ceil(DIMS);
    let job_len = group * DIMS;
    let mut sums = vec![0.0f32; keys.len() * kv_heads * chunks * job_len];
    crate::backend::cpu::for_each_chunk(&mut sums, job_len, |i, o| {
        let (t, rest) = (i / (kv_heads * chunks), i % (kv_heads * chunks));
        step.weighted(t, rest / chunks, rest % chunks, &scores, o);
    });
    for (i, job) in sums.chunks_exact(job_len).enumerate() {
        let (t, rest) = (i / (kv_heads * chunks), i % (kv_heads * chunks));
        let (g, c) = (rest / chunks, rest % chunks);
        let (d0, w) = (c * DIMS, (hd - c * DIMS).min(DIMS));
        for j in 0..group {
            let h = g * group + j;
            let sum = scores[(t * s.n_heads + h) * stride + stride - 1];
            let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
            let to = &mut out[(t * s.n_heads + h) * hd + d0..][..w];
            for (a, &b) in to.iter_mut().zip(&job[j * DIMS..][..w]) {
                *a = b * inv;
            }
        }
    }
}

/// The scores buffer shared by pass 1's jobs.
struct SharedScores(*mut f32, usize);

// SAFETY: pass 1's jobs write disjoint runs of the buffer (see `Step::scores`), which stays
// borrowed until the pass returns.
unsafe impl Sync for SharedScores {}

impl SharedScores {
    /// Values `start..start + n` of the buffer.
    ///
    /// # Safety
    /// No other job may touch those values while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn run(&self, start: usize, n: usize) -> &mut [f32] {
        assert!(start + n <= self.1, "a run within the scores");
        // SAFETY: within the buffer (checked above); disjoint from every other job's (the
        // caller's promise).
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), n) }
    }
}

impl Step<'_> {
    /// Pass 1's job: token `t`'s scores of key/value head `g`'s query heads over its range's
    /// positions `run·POSITIONS ..` (at most [`POSITIONS`]).
    fn scores(&self, t: usize, g: usize, run: usize, out: &SharedScores) {
        #[cfg(target_arch = "x86_64")]
        if crate::backend::cpu::dot::has_avx2() {
            // SAFETY: the CPU has AVX2 (checked above).
            unsafe { self.scores_avx2(t, g, run, out) };
            return;
        }
        self.scores_with(t, g, run, out)
    }

    /// [`Self::scores_with`] compiled for AVX2 (no FMA).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn scores_avx2(&self, t: usize, g: usize, run: usize, out: &SharedScores) {
        self.scores_with(t, g, run, out)
    }

    #[inline(always)]
    fn scores_with(&self, t: usize, g: usize, run: usize, out: &SharedScores) {
        let s = self.s;
        let hd = s.head_dim;
        let r = self.keys[t];
        let n = r.len();
        let (lo, hi) = ((run * POSITIONS).min(n), ((run + 1) * POSITIONS).min(n));
        if lo == hi {
            return;
        }
        let scale = s.scale();
        let off = g * hd;
        let mut buf = vec![0.0f32; hd];
        let heads = g * self.group..(g + 1) * self.group;
        let qs: Vec<&[f32]> = heads
            .clone()
            .map(|h| &self.q[t * s.q_stride + h * hd..][..hd])
            .collect();
        // SAFETY: (t, h)'s row's positions lo..hi are this job's alone: jobs differ in token,
        // key/value head (hence query heads) or run.
        let mut rows: Vec<&mut [f32]> = heads
            .map(|h| unsafe { out.run((t * s.n_heads + h) * self.stride + lo, hi - lo) })
            .collect();
        // each key row read once for the group's heads
        for i in lo..hi {
            if i + AHEAD < n {
                self.k.prefetch(r.row(r.first + i + AHEAD), off, hd);
            }
            let kr = self.k.span(r.row(r.first + i), off, &mut buf);
            for (row, qh) in rows.iter_mut().zip(&qs) {
                row[i - lo] = dot_f32(qh, kr) * scale;
            }
        }
    }

    /// Pass 3's job: token `t`'s sums `Σ_p e_p · v_p` of key/value head `g`'s query heads
    /// over values `c·DIMS ..` of the head, into `out: [group, DIMS]`.
    fn weighted(&self, t: usize, g: usize, c: usize, scores: &[f32], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if crate::backend::cpu::dot::has_avx2() {
            // SAFETY: the CPU has AVX2 (checked above).
            unsafe { self.weighted_avx2(t, g, c, scores, out) };
            return;
        }
        self.weighted_with(t, g, c, scores, out)
    }

    /// [`Self::weighted_with`] compiled for AVX2 (no FMA).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn weighted_avx2(&self, t: usize, g: usize, c: usize, scores: &[f32], out: &mut [f32]) {
        self.weighted_with(t, g, c, scores, out)
    }

    #[inline(always)]
    fn weighted_with(&self, t: usize, g: usize, c: usize, scores: &[f32], out: &mut [f32]) {
        let s = self.s;
        let hd = s.head_dim;
        let r = self.keys[t];
        let n = r.len();
        let (d0, w) = (c * DIMS, (hd - c * DIMS).min(DIMS));
        let mut buf = [0.0f32; DIMS];
        let buf = &mut buf[..w];
        let off = g * hd + d0;
        let row_of = |h: usize| &scores[(t * s.n_heads + h) * self.stride..][..n];
        let mut j = 0;
        while j < self.group {
            let heads = (self.group - j).min(HEADS);
            let first = g * self.group + j;
            let o = &mut out[j * DIMS..(j + heads) * DIMS];
            let e = |k: usize| row_of(first + k);
            match heads {
                4 => sum_rows::<4>(self.v, r, off, buf, e, o),
                3 => sum_rows::<3>(self.v, r, off, buf, e, o),
                2 => sum_rows::<2>(self.v, r, off, buf, e, o),
                _ => sum_rows::<1>(self.v, r, off, buf, e, o),
            }
            j += heads;
        }
    }
}

/// `out[h·DIMS + i] = Σ_p e(h)[p] · v[p][off + i]` for `H` heads (`e(h)`: head `h`'s
/// exponentials, one per position of `r`) over the range's positions in order (`buf.len()`
/// values, at most [`DIMS`]), the sums held in registers.
#[inline(always)]
fn sum_rows<'a, const H: usize>(
    v: &KvRows,
    r: KeyRange,
    off: usize,
    buf: &mut [f32],
    e: impl Fn(usize) -> &'a [f32],
    out: &mut [f32],
) {
    let (n, w) = (r.len(), buf.len());
    let e: [&[f32]; H] = std::array::from_fn(e);
    let mut acc = [[0.0f32; DIMS]; H];
    for p in 0..n {
        if p + AHEAD < n {
            v.prefetch(r.row(r.first + p + AHEAD), off, w);
        }
        let vr = v.span(r.row(r.first + p), off, buf);
        let mut row = [0.0f32; DIMS];
        row[..w].copy_from_slice(&vr[..w]);
        for (acc, e) in acc.iter_mut().zip(&e) {
            let x = e[p];
            for (a, &b) in acc.iter_mut().zip(&row) {
                *a += x * b;
            }
        }
    }
    for h in 0..H {
        out[h * DIMS..][..w].copy_from_slice(&acc[h][..w]);
    }
}
