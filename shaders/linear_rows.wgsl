// Linear layers in the shape that suits CPU-like adapters (SwiftShader, lavapipe): no barrier,
// no workgroup memory, a workgroup of RWG_SIZE invocations (one or two subgroups), and each
// invocation owning RROWS whole output rows, so every lane of a subgroup reads the same
// activation address (a broadcast) and only the weight loads differ. The math, the defines and
// the fused epilogues are those of linear.wgsl (shared through linear_io.wgsl); only the
// division of work differs, so results agree with the workgroup shape to rounding.
//
// linear_decode_rows (one token): invocation i computes rows 4i .. 4i + 4 over every column,
// one part (8 values) at a time. Under NORM_RMS the squares of x are summed in the same loop and
// the products scaled by 1 / rms at the end (x read once); under NORM_LAYER the invocation first
// takes the token's mean and variance itself (two more passes over x, which stays in cache).
// More than one token repeats per token, like linear_decode.
//
// linear_prefill_rows (many tokens): invocation (i, j) computes rows 4i .. 4i + 4 for tokens
// RTOK·j .. RTOK·j + RTOK: each part of its four weight rows is decoded once and used for all
// RTOK tokens, so weights are read once per RTOK tokens, with no shared tile.
//
// KV_BLOCKS (linear.wgsl) is the one place with a barrier: a workgroup's RWG_SIZE · RROWS rows
// span whole 32-value blocks, and after each token's rows are stored (a storageBarrier later)
// one invocation per block encodes it into the cache.
//
// Loops: llvmpipe stops a shader's loops after about 65k iterations in all (a guard against
// runaway shaders), so loops with a runtime bound stay per row or per column, never per part
// and token: a row of 14,336 columns is 1,792 parts.
#include "linear_io.wgsl"

// Rows per invocation: one vec4 of sums (GLU pairs and RoPE pairs never straddle invocations).
const RROWS: u32 = 4u;
// Tokens per prefill invocation (must match LINEAR_PREFILL_ROWS_TOKENS in linear.rs; the
// kernel spells out four).
const RTOK: u32 = 4u;

// (mean, 1 / sqrt(var + eps)) of token t's whole row, computed by one invocation; (0, 1) when
// the layer has no norm, and under NORM_RMS only the mean slot is meaningful (0): the RMS
// scale is applied after the product loop.
fn row_stats(t: u32) -> vec2<f32> {
    var stats = vec2<f32>(0.0, 1.0);
#ifdef NORM_LAYER
    let cols = params.cols;
    stats.x = partial_plain_sum(t, 0u, 1u) / f32(cols);
    stats.y = inverseSqrt(partial_sum(t, 0u, 1u, stats.x) / f32(cols) + params.eps);
#endif
    return stats;
}

// The first row of the invocation's group, or `params.rows` (nothing to do) past the end.
fn rows_first(lid: u32, wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    let inv = (wid.x + wid.y * nwg.x) * RWG_SIZE + lid;
    return min(inv * RROWS, params.rows);
}

// Stores the four sums of rows row0 .. row0 + live for token t.
fn store_rows(t: u32, row0: u32, live: u32, total: vec4<f32>) {
#ifdef GLU
    // row0 and live are even: (gate, up) pairs
    for (var i = 0u; i < live / 2u; i++) {
        store(t, row0 / 2u + i, total[2u * i], total[2u * i + 1u]);
    }
#else
    for (var i = 0u; i < live; i++) {
        // the pair partner (RoPE) is the neighbouring row, within the group
        store(t, row0 + i, total[i], total[min(i ^ 1u, 3u)]);
    }
#endif
}

@compute @workgroup_size(RWG_SIZE)
fn linear_decode_rows(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let row0 = rows_first(lid, wid, nwg);
#ifdef KV_BLOCKS
    // the workgroup's first row (its invocations' rows are consecutive); every invocation
    // reaches the barrier, so none returns early
    let group_row0 = rows_first(0u, wid, nwg);
#else
    if row0 >= params.rows {
        return;
    }
#endif
    let live = min(RROWS, params.rows - row0);
    let cols = params.cols;
    let parts = q_parts(cols);
    let n_tokens = token_count();
    var first = 0u;
#ifdef LAST_ROW
    first = max(n_tokens, 1u) - 1u;
#endif
    for (var t = first; t < n_tokens; t++) {
#ifdef KV_BLOCKS
        if live > 0u {
            decode_rows_token(t, first, row0, live, cols, parts);
        }
        storageBarrier();
        // RWG_SIZE · RROWS rows: a whole number of blocks (checked on the host)
        if lid < RWG_SIZE * RROWS / 32u {
            kv_encode_block(t, group_row0 + 32u * lid);
        }
#else
        decode_rows_token(t, first, row0, live, cols, parts);
#endif
    }
}

// Rows row0 .. row0 + live of token t (output row t - first).
fn decode_rows_token(t: u32, first: u32, row0: u32, live: u32, cols: u32, parts: u32) {
    let stats = row_stats(t);
    var sum_sq = 0.0;
    var acc = vec4<f32>(0.0);
    for (var p = 0u; p < parts; p++) {
#ifdef NORM_RMS
        let lo = x4_raw(t, 8u * p);
        let hi = x4_raw(t, 8u * p + 4u);
        sum_sq += dot(lo, lo) + dot(hi, hi);
#endif
        let xp = Q8(x4(t, 8u * p, stats), x4(t, 8u * p + 4u, stats));
        acc.x += q_dot(q_load(row0, p, cols), xp);
        if live > 1u {
            acc.y += q_dot(q_load(row0 + 1u, p, cols), xp);
        }
        if live > 2u {
            acc.z += q_dot(q_load(row0 + 2u, p, cols), xp);
        }
        if live > 3u {
            acc.w += q_dot(q_load(row0 + 3u, p, cols), xp);
        }
    }
#ifdef NORM_RMS
    acc *= inverseSqrt(sum_sq / f32(cols) + params.eps);
#endif
    store_rows(t - first, row0, live, acc);
}

// Part p of row r decoded, or zeros for rows past the matrix.
fn part_or_zero(r: u32, p: u32, cols: u32) -> Q8 {
    if r >= params.rows {
        return Q8(vec4<f32>(0.0), vec4<f32>(0.0));
    }
    return q_dequant(q_load(r, p, cols));
}

fn dot8(a: Q8, b: Q8) -> f32 {
#ifdef MM_F16
    return dot(mm_prod4(a.lo, b.lo) + mm_prod4(a.hi, b.hi), vec4<f32>(1.0));
#else
    return dot(a.lo, b.lo) + dot(a.hi, b.hi);
#endif
}

// The four rows' products with token t's part p (input normalised with `stats`).
fn rows4(w0: Q8, w1: Q8, w2: Q8, w3: Q8, t: u32, p: u32, stats: vec2<f32>) -> vec4<f32> {
    let xp = Q8(x4(t, 8u * p, stats), x4(t, 8u * p + 4u, stats));
    return vec4<f32>(dot8(w0, xp), dot8(w1, xp), dot8(w2, xp), dot8(w3, xp));
}

// Squares of token t's raw part p (the RMS statistic, summed with the products).
fn sq8(t: u32, p: u32) -> f32 {
    let lo = x4_raw(t, 8u * p);
    let hi = x4_raw(t, 8u * p + 4u);
    return dot(lo, lo) + dot(hi, hi);
}

// The four tokens are spelled out (no per-token array or loop): private arrays indexed in a
// loop live in memory on SwiftShader, and plain variables stay in registers. Tokens past the
// step read the step's last token and are not stored.
@compute @workgroup_size(RWG_SIZE)
fn linear_prefill_rows(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    // x spans the row groups (at most maxComputeWorkgroupsPerDimension, checked on the host),
    // y the token tiles.
    let row0 = min((wid.x * RWG_SIZE + lid) * RROWS, params.rows);
    let t0 = wid.y * RTOK;
    let n_tokens = token_count();
    if t0 >= n_tokens {
        return;
    }
#ifdef KV_BLOCKS
    // every invocation reaches the barrier: none returns early
    if row0 < params.rows {
        prefill_rows_tile(row0, t0, n_tokens);
    }
    storageBarrier();
    // the workgroup's RWG_SIZE · RROWS rows are whole blocks (checked on the host): one
    // invocation per block and token
    let group_row0 = wid.x * RWG_SIZE * RROWS;
    if lid < RWG_SIZE * RROWS / 32u * RTOK {
        kv_encode_block(t0 + lid % RTOK, group_row0 + 32u * (lid / RTOK));
    }
#else
    if row0 < params.rows {
        prefill_rows_tile(row0, t0, n_tokens);
    }
#endif
}

// Rows row0 .. row0 + 4 (those below params.rows) of tokens t0 .. t0 + RTOK (those in the
// step).
fn prefill_rows_tile(row0: u32, t0: u32, n_tokens: u32) {
    let live = min(RROWS, params.rows - row0);
    let last = n_tokens - 1u;
    let ta = t0;
    let tb = min(t0 + 1u, last);
    let tc = min(t0 + 2u, last);
    let td = min(t0 + 3u, last);
    let cols = params.cols;
    let parts = q_parts(cols);
    let sa = row_stats(ta);
    let sb = row_stats(tb);
    let sc = row_stats(tc);
    let sd = row_stats(td);
    var sq = vec4<f32>(0.0);
    var acc_a = vec4<f32>(0.0);
    var acc_b = vec4<f32>(0.0);
    var acc_c = vec4<f32>(0.0);
    var acc_d = vec4<f32>(0.0);
    for (var p = 0u; p < parts; p++) {
        let w0 = part_or_zero(row0, p, cols);
        let w1 = part_or_zero(row0 + 1u, p, cols);
        let w2 = part_or_zero(row0 + 2u, p, cols);
        let w3 = part_or_zero(row0 + 3u, p, cols);
        acc_a += rows4(w0, w1, w2, w3, ta, p, sa);
        acc_b += rows4(w0, w1, w2, w3, tb, p, sb);
        acc_c += rows4(w0, w1, w2, w3, tc, p, sc);
        acc_d += rows4(w0, w1, w2, w3, td, p, sd);
#ifdef NORM_RMS
        sq += vec4<f32>(sq8(ta, p), sq8(tb, p), sq8(tc, p), sq8(td, p));
#endif
    }
#ifdef NORM_RMS
    let scale = inverseSqrt(sq / f32(cols) + params.eps);
    acc_a *= scale.x;
    acc_b *= scale.y;
    acc_c *= scale.z;
    acc_d *= scale.w;
#endif
    store_rows(ta, row0, live, acc_a);
    if t0 + 1u <= last {
        store_rows(tb, row0, live, acc_b);
    }
    if t0 + 2u <= last {
        store_rows(tc, row0, live, acc_c);
    }
    if t0 + 3u <= last {
        store_rows(td, row0, live, acc_d);
    }
}
