// Linear layers with weights in their stored type (see quant.wgsl):
//   y[t, r] (+)= sum_c W[r, c] * x[t, c] (+ bias[r])   for t < n_tokens
// W: [rows, cols] as stored, x: [max_tokens, cols] f32, y: [max_tokens, rows] f32,
// bias: [rows] f32. With ACCUMULATE the result is added to y (a residual connection fused into
// the layer that produces it); HAS_BIAS adds the bias. X_VEC4 (quantized types, whose cols are
// multiples of 32) reads x as vec4s.
//
// Fusions, each a define:
// - NORM (with NORM_RMS or NORM_LAYER): x is first normalised per token (the RMS or layer norm before the
//   layer), with norm_w (and norm_b) [cols] and params.eps; each workgroup computes the
//   token's statistics itself, which costs a read of x but saves a dispatch and a buffer.
// - GLU: rows are interleaved pairs (gate 0, up 0, gate 1, up 1, ...) and y[t, r] =
//   silu(gate_r) * up_r for r < rows / 2: the SwiGLU of a feed-forward layer in its producer.
// - GELU: y = gelu_tanh(W·x + bias); with GLU, gelu_tanh(gate_r) * up_r (GeGLU). GELU_ERF: gelu_erf.
// - KV_WRITE: the layer is a stacked Q/K/V projection (rows q | k | v, params.q_rows and
//   params.kv_rows of them): its k and v rows of token t are also written to k_cache and
//   v_cache at position p = token_pos(t) (row cache_row(t, p, ring)), and with ROPE the q and k rows are first rotated (pairs
//   of adjacent rows (2i, 2i + 1) within a head of params.head_dim, by the angle of rope_freqs[i]
//   at the position): the RoPE + KV-cache kernel folded into its producer. Caches of f32 are
//   written value by value, KV_F16 ones a pair of rows at a time; with KV_BLOCKS (caches of
//   kinds K_KIND / V_KIND with 32-value blocks, q_rows and kv_rows multiples of 32) each
//   workgroup's K and V rows span whole blocks: decode workgroups past the query rows compute
//   32 rows (BLOCK_QUADS passes), and after a storageBarrier a workgroup encodes its blocks
//   from what it stored in y.
//   KV_DEFER leaves the caches to a KV store dispatch (kv_store.wgsl).
// - LAST_ROW: only the step's last token is computed, written to row 0 of y (an LM head whose
//   other rows nobody reads). Decode kernel only.
//
// Each kernel comes in two shapes, each a variant of the plan declared with its geometry in
// src/backend/gpu/variants/linear.rs: the workgroup shape (GPUs; below) and, under
// ROWS_SHAPE, the rows shape (CPU-like adapters; further below). The geometry the host also
// computes with arrives as defines: WG_SIZE (invocations), ROWS (rows per workgroup pass, per
// prefill tile, or per invocation in the rows shape) and TOKENS (tokens per prefill tile or
// invocation). PREFILL selects the prefill kernel (linear_prefill), otherwise the decode
// kernel (linear_decode) is compiled.
//
// The workgroup shape.
//
// linear_decode (one token; memory-bound): a workgroup of WG_SIZE invocations computes ROWS
// consecutive rows. Invocation i takes parts i, i + WG_SIZE, ... of the rows (8 values each),
// so neighbouring invocations read neighbouring bytes of a row; it loads the 8 activations of
// its part once and uses them for all ROWS rows. The ROWS partial sums are reduced together as
// one vec4 (reduce.wgsl). Workgroups are numbered across x and y (vocabulary-sized outputs
// need more than 65535 of them). Given several tokens (a batched decode step: one token per
// sequence) it takes them DECODE_TOKENS at a time, loading each weight part once per group;
// each token's sums keep the one-token order, so a sequence's bits do not depend on its
// neighbours. Long prompts have their own kernel (prefill).
//
// linear_prefill (many tokens; compute-bound): a workgroup of WG_SIZE invocations computes a
// tile of ROWS rows x TOKENS tokens (256, 64 and 32: the indexing below is written for these).
// For each chunk of 32 columns it dequantizes the tile's weights once into shared memory (one part per invocation) and stages the tokens' activations beside
// them; each invocation then accumulates a 4-row x 2-token block from shared memory. Every
// weight block is thus read once per tile of 32 tokens, not once per token.
//
// The rows shape (ROWS_SHAPE).
//
// The shape that suits CPU-like adapters (SwiftShader, lavapipe): no barrier,
// no workgroup memory, a workgroup of WG_SIZE invocations (one or two subgroups), and each
// invocation owning ROWS whole output rows, so every lane of a subgroup reads the same
// activation address (a broadcast) and only the weight loads differ. The math, the defines and
// the fused epilogues are those of the workgroup shape (shared through linear_io.wgsl); only
// the division of work differs, so results agree with the workgroup shape to rounding.
//
// linear_decode (one token): invocation i computes rows 4i .. 4i + 4 over every column,
// one part (8 values) at a time. Under NORM_RMS the squares of x are summed in the same loop and
// the products scaled by 1 / rms at the end (x read once); under NORM_LAYER the invocation first
// takes the token's mean and variance itself (two more passes over x, which stays in cache).
// More than one token repeats per token, like the workgroup shape's decode kernel.
//
// linear_prefill (many tokens): invocation (i, j) computes rows 4i .. 4i + 4 for tokens
// 4j .. 4j + 4 (ROWS and TOKENS are 4: the kernel spells them out): each part of its four
// weight rows is decoded once and used for all four tokens, so weights are read once per
// four tokens, with no shared tile.
//
// KV_BLOCKS is the one place with a barrier: a workgroup's WG_SIZE · ROWS rows span whole
// 32-value blocks, and after each token's rows are stored (a storageBarrier later)
// one invocation per block encodes it into the cache.
//
// Loops: llvmpipe stops a shader's loops after about 65k iterations in all (a guard against
// runaway shaders), so loops with a runtime bound stay per row or per column, never per part
// and token: a row of 14,336 columns is 1,792 parts.
#include "linear_io.wgsl"

#ifdef ROWS_SHAPE
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
    let inv = (wid.x + wid.y * nwg.x) * WG_SIZE + lid;
    return min(inv * ROWS, params.rows);
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

#ifdef PREFILL
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
    let xp = x_part(t, p, stats);
    return vec4<f32>(dot8(w0, xp), dot8(w1, xp), dot8(w2, xp), dot8(w3, xp));
}

// The four tokens are spelled out (no per-token array or loop): private arrays indexed in a
// loop live in memory on SwiftShader, and plain variables stay in registers. Tokens past the
// step read the step's last token and are not stored.
@compute @workgroup_size(WG_SIZE)
fn linear_prefill(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    // x spans the row groups (at most maxComputeWorkgroupsPerDimension, checked on the host),
    // y the token tiles.
    let row0 = min((wid.x * WG_SIZE + lid) * ROWS, params.rows);
    let t0 = wid.y * TOKENS;
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
    // the workgroup's WG_SIZE · ROWS rows are whole blocks (checked on the host): one
    // invocation per block and token
    let group_row0 = wid.x * WG_SIZE * ROWS;
    if lid < WG_SIZE * ROWS / 32u * TOKENS {
        kv_encode_block(t0 + lid % TOKENS, group_row0 + 32u * (lid / TOKENS));
    }
#else
    if row0 < params.rows {
        prefill_rows_tile(row0, t0, n_tokens);
    }
#endif
}

// Rows row0 .. row0 + 4 (those below params.rows) of tokens t0 .. t0 + TOKENS (those in the
// step).
fn prefill_rows_tile(row0: u32, t0: u32, n_tokens: u32) {
    let live = min(ROWS, params.rows - row0);
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
#else
@compute @workgroup_size(WG_SIZE)
fn linear_decode(
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
    let live = min(ROWS, params.rows - row0);
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
        // WG_SIZE · ROWS rows: a whole number of blocks (checked on the host)
        if lid < WG_SIZE * ROWS / 32u {
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
        sum_sq += sq8(t, p);
#endif
        let xp = x_part(t, p, stats);
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
#endif
#else
#ifdef PREFILL
// Columns per shared-memory chunk of the prefill tile.
const TILE_K: u32 = 32u;

// The weight tile, [TILE_K columns][ROWS / 4 row quads]: an invocation reads its 4 rows at
// one column as one vec4.
// With MM_F16 both tiles hold f16 (half the shared memory) and the products are f16.
#ifdef MM_F16
alias tile_w4 = vec4<f16>;
alias tile_x2 = vec2<f16>;
#else
alias tile_w4 = vec4<f32>;
alias tile_x2 = vec2<f32>;
#endif
var<workgroup> tile_w: array<tile_w4, 512>;
// The activation tile, [TILE_K columns][TOKENS / 2 token pairs].
var<workgroup> tile_x: array<tile_x2, 512>;
#ifdef NORM
// Partial sums of the tile's tokens (8 invocations per token), then each token's
// (mean, 1 / sqrt(var + eps)).
var<workgroup> stat_part: array<f32, WG_SIZE>;
var<workgroup> tile_stats: array<vec2<f32>, TOKENS>;
#endif

@compute @workgroup_size(WG_SIZE)
fn linear_prefill(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let row_base = wid.x * ROWS;
    let tok_base = wid.y * TOKENS;
    let n_tokens = token_count();
    if row_base >= params.rows || tok_base >= n_tokens {
        return;
    }
    let cols = params.cols;
    let parts = q_parts(cols);

    // Loading roles: 4 invocations per weight row (one part each: the 32 columns of a chunk),
    // 8 per token (4 columns each).
    let load_row = lid / 4u;
    let load_part = lid % 4u;
    let load_tok = lid / 8u;
    let load_col = (lid % 8u) * 4u;
    let w_row = row_base + load_row;
    let x_tok = tok_base + load_tok;
    // Computing roles: rows 4 * quad .. + 4, tokens 2 * pair, 2 * pair + 1 of the tile.
    let quad = lid % 16u;
    let pair = lid / 16u;

#ifdef NORM
    {
        // 8 invocations per token, columns lane, lane + 8, ...
        let lane8 = lid % 8u;
        let live_tok = x_tok < n_tokens;
        var mean = 0.0;
#ifdef NORM_LAYER
        stat_part[lid] = select(0.0, partial_plain_sum(x_tok, lane8, 8u), live_tok);
        workgroupBarrier();
        var sum = 0.0;
        for (var i = 0u; i < 8u; i++) {
            sum += stat_part[load_tok * 8u + i];
        }
        mean = sum / f32(cols);
        workgroupBarrier();
#endif
        stat_part[lid] = select(0.0, partial_sum(x_tok, lane8, 8u, mean), live_tok);
        workgroupBarrier();
        if lane8 == 0u {
            var sq = 0.0;
            for (var i = 0u; i < 8u; i++) {
                sq += stat_part[load_tok * 8u + i];
            }
            tile_stats[load_tok] = vec2<f32>(mean, inverseSqrt(sq / f32(cols) + params.eps));
        }
        workgroupBarrier();
    }
    let x_stats = tile_stats[load_tok];
#else
    let x_stats = vec2<f32>(0.0, 1.0);
#endif

    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    let chunks = (cols + TILE_K - 1u) / TILE_K;
    for (var kc = 0u; kc < chunks; kc++) {
        let part = kc * 4u + load_part;
        var v = Q8(vec4<f32>(0.0), vec4<f32>(0.0));
        if w_row < params.rows && part < parts {
            v = q_dequant(q_load(w_row, part, cols));
        }
        let k0 = load_part * 8u;
        let slot = load_row / 4u;
        let comp = load_row % 4u;
#ifdef MM_F16
        let v_lo = mm_h4(v.lo);
        let v_hi = mm_h4(v.hi);
#else
        let v_lo = v.lo;
        let v_hi = v.hi;
#endif
        for (var i = 0u; i < 4u; i++) {
            tile_w[(k0 + i) * 16u + slot][comp] = v_lo[i];
            tile_w[(k0 + 4u + i) * 16u + slot][comp] = v_hi[i];
        }
        var xv = vec4<f32>(0.0);
        if x_tok < n_tokens {
            xv = x4(x_tok, kc * TILE_K + load_col, x_stats);
        }
#ifdef MM_F16
        let xs = mm_h4(xv);
#else
        let xs = xv;
#endif
        for (var i = 0u; i < 4u; i++) {
            tile_x[(load_col + i) * 16u + load_tok / 2u][load_tok % 2u] = xs[i];
        }
        workgroupBarrier();
        for (var k = 0u; k < TILE_K; k++) {
            let w4 = tile_w[k * 16u + quad];
            let x2 = tile_x[k * 16u + pair];
            acc0 += vec4<f32>(w4 * x2.x);
            acc1 += vec4<f32>(w4 * x2.y);
        }
        workgroupBarrier();
    }

    let r0 = row_base + 4u * quad;
    let t0 = tok_base + 2u * pair;
#ifdef GLU
    // rows r0 .. r0 + 4 are two (gate, up) pairs: outputs r0 / 2 and r0 / 2 + 1
    for (var i = 0u; i < 2u; i++) {
        let r = r0 + 2u * i;
        if r < params.rows {
            if t0 < n_tokens {
                store(t0, r / 2u, acc0[2u * i], acc0[2u * i + 1u]);
            }
            if t0 + 1u < n_tokens {
                store(t0 + 1u, r / 2u, acc1[2u * i], acc1[2u * i + 1u]);
            }
        }
    }
#else
    for (var i = 0u; i < 4u; i++) {
        let r = r0 + i;
        if r < params.rows {
            if t0 < n_tokens {
                store(t0, r, acc0[i], acc0[i ^ 1u]);
            }
            if t0 + 1u < n_tokens {
                store(t0 + 1u, r, acc1[i], acc1[i ^ 1u]);
            }
        }
    }
#ifdef KV_BLOCKS
    // the tile's two row blocks for each of its tokens: one invocation each
    storageBarrier();
    if lid < 2u * TOKENS {
        kv_encode_block(tok_base + lid % TOKENS, row_base + 32u * (lid / TOKENS));
    }
#endif
#endif
}
#else
#include "reduce.wgsl"

// Passes of ROWS rows a decode workgroup spanning a 32-row KV block makes (KV_BLOCKS).
const BLOCK_QUADS: u32 = 8u;
// Tokens whose products share one load of each weight part (a batched decode step's rows).
const DECODE_TOKENS: u32 = 4u;

@compute @workgroup_size(WG_SIZE)
fn linear_decode(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
#ifdef SUBGROUPS
    @builtin(subgroup_invocation_id) lane: u32,
#endif
) {
#ifndef SUBGROUPS
    let lane = 0u;
#endif
    let group = wid.x + wid.y * nwg.x;
    var row_base = group * ROWS;
    var quads = 1u;
#ifdef KV_BLOCKS
    // query rows in groups of ROWS as usual, then the key and value rows a block per group
    let q_groups = params.q_rows / ROWS;
    if group >= q_groups {
        row_base = params.q_rows + (group - q_groups) * ROWS * BLOCK_QUADS;
        quads = BLOCK_QUADS;
    }
#endif
    if row_base >= params.rows {
        return;
    }
    let cols = params.cols;
    let parts = q_parts(cols);
    let n_tokens = token_count();
    var first = 0u;
#ifdef LAST_ROW
    first = max(n_tokens, 1u) - 1u;
#endif
    // Tokens in groups of DECODE_TOKENS: each weight part is loaded once per group and used
    // for every token of it (a batched decode step reads the weights once per 4 sequences).
    // Each token's sums run in the same order as when it is alone, so its bits are the same.
    for (var t0 = first; t0 < n_tokens; t0 += DECODE_TOKENS) {
        let group = min(DECODE_TOKENS, n_tokens - t0);
        for (var quad = 0u; quad < quads; quad++) {
            let row0 = row_base + quad * ROWS;
            if row0 >= params.rows {
                break;
            }
            let live = min(ROWS, params.rows - row0);
            // (every per-quad variable has an initializer: a declaration inside a loop must
            // start from zero on each pass, which SwiftShader's compile did not give a bare `var`)
            var stats = array<vec2<f32>, DECODE_TOKENS>();
            for (var j = 0u; j < DECODE_TOKENS; j++) {
                stats[j] = vec2<f32>(0.0, 1.0);
            }
#ifdef NORM_LAYER
            // Layer norms: mean and variance first, in two passes (see norm.wgsl for why).
            for (var j = 0u; j < group; j++) {
                let t = t0 + j;
                let sum = workgroup_sum(vec4<f32>(partial_plain_sum(t, lid, WG_SIZE), 0.0, 0.0, 0.0), lid, lane).x;
                let mean = sum / f32(cols);
                let sq = workgroup_sum(vec4<f32>(partial_sum(t, lid, WG_SIZE, mean), 0.0, 0.0, 0.0), lid, lane).x;
                stats[j] = vec2<f32>(mean, inverseSqrt(sq / f32(cols) + params.eps));
            }
#endif
            // RMS norms: the products use x * w and are scaled by 1 / rms at the end, and the
            // squares are summed in the same pass over x, so x is read once and the two sums share
            // one reduction.
            var sum_sq = array<f32, DECODE_TOKENS>();
            var acc = array<vec4<f32>, DECODE_TOKENS>();
            for (var p = lid; p < parts; p += WG_SIZE) {
                let w0 = q_load(row0, p, cols);
                var w1 = QPart();
                var w2 = QPart();
                var w3 = QPart();
                if live > 1u {
                    w1 = q_load(row0 + 1u, p, cols);
                }
                if live > 2u {
                    w2 = q_load(row0 + 2u, p, cols);
                }
                if live > 3u {
                    w3 = q_load(row0 + 3u, p, cols);
                }
                for (var j = 0u; j < DECODE_TOKENS; j++) {
                    if j >= group {
                        break;
                    }
                    let t = t0 + j;
#ifdef NORM_RMS
                    sum_sq[j] += sq8(t, p);
#endif
                    let xp = x_part(t, p, stats[j]);
                    acc[j].x += q_dot(w0, xp);
                    if live > 1u {
                        acc[j].y += q_dot(w1, xp);
                    }
                    if live > 2u {
                        acc[j].z += q_dot(w2, xp);
                    }
                    if live > 3u {
                        acc[j].w += q_dot(w3, xp);
                    }
                }
            }
            for (var j = 0u; j < group; j++) {
#ifdef NORM_RMS
                let sums = workgroup_sum_pair(acc[j], vec4<f32>(sum_sq[j], 0.0, 0.0, 0.0), lid, lane);
                let total = sums[0] * inverseSqrt(sums[1].x / f32(cols) + params.eps);
#else
                let total = workgroup_sum(acc[j], lid, lane);
#endif
                let out_t = t0 + j - first;
#ifdef GLU
                // row0 and live are even: pairs never straddle workgroups
                if lid < live / 2u {
                    store(out_t, row0 / 2u + lid, total[2u * lid], total[2u * lid + 1u]);
                }
#else
                if lid < live {
                    // the pair partner (RoPE) is the neighbouring row: rows come in even groups
                    store(out_t, row0 + lid, total[lid], total[min(lid ^ 1u, 3u)]);
                }
#endif
            }
        }
#ifdef KV_BLOCKS
        // (query groups pass the barrier too: `quads` is the same for the whole workgroup)
        storageBarrier();
        if lid == 0u && quads == BLOCK_QUADS {
            for (var j = 0u; j < group; j++) {
                kv_encode_block(t0 + j, row_base);
            }
        }
#endif
    }
}
#endif
#endif
