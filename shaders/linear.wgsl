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
// - GELU: y = gelu_tanh(W·x + bias); with GLU, gelu_tanh(gate_r) * up_r (GeGLU).
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
// linear_prefill (many tokens; compute-bound): a workgroup of 256 invocations computes a tile of
// TILE_R rows x TILE_T tokens. For each chunk of 32 columns it dequantizes the tile's weights
// once into shared memory (one part per invocation) and stages the tokens' activations beside
// them; each invocation then accumulates a 4-row x 2-token block from shared memory. Every
// weight block is thus read once per tile of 32 tokens, not once per token.
#include "reduce.wgsl"
#include "linear_io.wgsl"

// Rows per decode workgroup pass: one vec4 of partial sums.
const ROWS: u32 = 4u;
// Passes of ROWS rows a decode workgroup spanning a 32-row KV block makes (KV_BLOCKS).
const BLOCK_QUADS: u32 = 8u;
// Tokens whose products share one load of each weight part (a batched decode step's rows).
const DECODE_TOKENS: u32 = 4u;

// Prefill tile: rows, tokens, columns per shared-memory chunk, invocations.
const TILE_R: u32 = 64u;
const TILE_T: u32 = 32u;
const TILE_K: u32 = 32u;
const PREFILL_WG: u32 = 256u;

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
                    let lo = x4_raw(t, 8u * p);
                    let hi = x4_raw(t, 8u * p + 4u);
                    sum_sq[j] += dot(lo, lo) + dot(hi, hi);
#endif
                    let xp = Q8(x4(t, 8u * p, stats[j]), x4(t, 8u * p + 4u, stats[j]));
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

// The weight tile, [TILE_K columns][TILE_R / 4 row quads]: an invocation reads its 4 rows at
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
// The activation tile, [TILE_K columns][TILE_T / 2 token pairs].
var<workgroup> tile_x: array<tile_x2, 512>;
#ifdef NORM
// Partial sums of the tile's tokens (8 invocations per token), then each token's
// (mean, 1 / sqrt(var + eps)).
var<workgroup> stat_part: array<f32, PREFILL_WG>;
var<workgroup> tile_stats: array<vec2<f32>, TILE_T>;
#endif

@compute @workgroup_size(PREFILL_WG)
fn linear_prefill(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let row_base = wid.x * TILE_R;
    let tok_base = wid.y * TILE_T;
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
    if lid < 2u * TILE_T {
        kv_encode_block(tok_base + lid % TILE_T, row_base + 32u * (lid / TILE_T));
    }
#endif
#endif
}
