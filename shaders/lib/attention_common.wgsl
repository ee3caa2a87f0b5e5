// What the attention kernels share (attention.wgsl, attention_rows.wgsl,
// attention_merge.wgsl): their parameters, the step uniform, and how a step's keys are cut into
// splits (flash-decoding) and where a split's partial result lives.
//
// A split partial is one record of head_dim + 2 floats per (token, head, split):
//   [0, hd)  the output accumulator sum_j exp(s_j - m) v_j (not divided by l),
//   hd       m, the largest score of the split's keys (NEG_BIG when the split has none),
//   hd + 1   l, sum_j exp(s_j - m).
// partial: [max_tokens_split, n_heads, max_splits, hd + 2].

struct Params {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    q_stride: u32,
    max_positions: u32,
    scale: f32,
    // keys per split (SPLIT kernels and the merge)
    keys_per_split: u32,
    // splits a partial buffer has room for per (token, head)
    max_splits: u32,
    // local attention: a token reads only its `window` latest keys (0: every key)
    window: u32,
    // rows per sequence of the layer's ring (0: the cache keeps every position; cache_row)
    ring: u32,
    // 1: every token reads every key its sequence holds after the step (an encoder's
    // bidirectional attention); 0: keys up to its own position (causal)
    bidirectional: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
#include "step.wgsl"

// Finite stand-in for -infinity (WGSL implementations may assume no infinities).
const NEG_BIG: f32 = -3.4028234e38;

// Keys a token at position p attends to: 0..=p (the end of its range), or with bidirectional
// attention every key of its sequence after the step (kv_len, one sequence per such step),
// capped at the cache (positions past it were refused on the host, never read past it).
fn token_keys(t: u32) -> u32 {
    let end = select(token_pos(t) + 1u, step_params.kv_len, params.bidirectional != 0u);
    return min(end, params.max_positions);
}

// The first key token `t` reads: 0, or with a local window the oldest key inside it.
fn token_first_key(t: u32) -> u32 {
    let n = token_keys(t);
    if params.window == 0u {
        return 0u;
    }
    return n - min(n, params.window);
}

// The key positions [first, end) that split `s` of token `t` walks (splits count from the
// token's first key): all of them without SPLIT. key_row gives each one's cache row.
fn split_keys(s: u32, t: u32) -> vec2<u32> {
    let n = token_keys(t);
    let lo = token_first_key(t);
#ifdef SPLIT
    let first = min(lo + s * params.keys_per_split, n);
    return vec2<u32>(first, first + min(params.keys_per_split, n - first));
#else
    return vec2<u32>(lo, n);
#endif
}

// The cache row of key position j of token t.
fn key_row(t: u32, j: u32) -> u32 {
    return cache_row(t, j, params.ring);
}

// First element of the partial record of (token t, head h, split s).
fn partial_index(t: u32, h: u32, s: u32) -> u32 {
    return ((t * params.n_heads + h) * params.max_splits + s) * (params.head_dim + 2u);
}

#ifdef OUT_F16
enable f16;
#endif

// An output value as attn_out holds it: f16 under OUT_F16 (precision f16, where the output
// projection reads its input as f16), clamped to f16's range.
#ifdef OUT_F16
alias OutElem = f16;
fn out_value(v: f32) -> OutElem {
    return OutElem(clamp(v, -65504.0, 65504.0));
}
#else
alias OutElem = f32;
fn out_value(v: f32) -> OutElem {
    return v;
}
#endif
