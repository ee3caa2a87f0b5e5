// The KV-cache write for caches of kinds other than f32 (kv_kind.wgsl; src/dtype/kv.rs is the
// CPU reference): the step's keys and values, already rotated, are encoded into the K and V
// caches at positions p = token_pos(t) (rows cache_row(t, p, ring), step.wgsl), for
// t < step_params.n_tokens.
//   k_src[t * k_stride + k_off + c], v_src[t * v_stride + v_off + c], c < kv_dim: the step's
//   rows (for a stacked q | k | v projection both are its output, bound twice);
//   k_cache, v_cache: [rows, row words of their kind] u32 (rows: max_positions per
//   sequence, or ring for a local layer's ring).
// One invocation encodes one pair of 32-value blocks of one row (the two blocks whose f16
// scales share a word), so no word is written by two invocations. Items per token: the K
// row's pairs, then the V row's; grid (ceil(items / WG_SIZE), n_tokens).

struct Params {
    kv_dim: u32,
    max_positions: u32,
    k_off: u32,
    k_stride: u32,
    v_off: u32,
    v_stride: u32,
    // rows per sequence of a local layer's ring (0: every position kept)
    ring: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
#include "step.wgsl"
@group(0) @binding(2) var<storage, read> k_src: array<f32>;
@group(0) @binding(3) var<storage, read> v_src: array<f32>;
@group(0) @binding(4) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<u32>;

fn kv_word(which: u32, i: u32) -> u32 {
    if which == 0u {
        return k_cache[i];
    }
    return v_cache[i];
}

fn kv_put(which: u32, i: u32, w: u32) {
    if which == 0u {
        k_cache[i] = w;
    } else {
        v_cache[i] = w;
    }
}

#include "kv_kind.wgsl"

// Value c of token t's K (0) or V (1) row; 0 past the row (padding of the last block).
fn kv_src(which: u32, t: u32, c: u32) -> f32 {
    if c >= params.kv_dim {
        return 0.0;
    }
    if which == 0u {
        return k_src[t * params.k_stride + params.k_off + c];
    }
    return v_src[t * params.v_stride + params.v_off + c];
}

#include "kv_encode.wgsl"

@compute @workgroup_size(WG_SIZE)
fn kv_store(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let t = wid.y;
    let pos = token_pos(t);
    // positions past the cache were refused on the host; never write outside it anyway
    if t >= step_params.n_tokens || pos >= params.max_positions {
        return;
    }
    let blocks = (params.kv_dim + 31u) / 32u;
    let pairs = (blocks + 1u) / 2u;
    var item = wid.x * WG_SIZE + lid;
    var which = 0u;
    if item >= pairs {
        which = 1u;
        item -= pairs;
    }
    if item >= pairs {
        return;
    }
    let kind = kv_kind(which);
    let base = cache_row(t, pos, params.ring) * kv_row_words(kind, params.kv_dim);
    let sw = kv_scale_words(kind, params.kv_dim);
    let b = 2u * item;
    let d0 = encode_block(which, kind, t, b, base, sw, params.kv_dim);
    var d1 = 0.0;
    if b + 1u < blocks {
        d1 = encode_block(which, kind, t, b + 1u, base, sw, params.kv_dim);
    }
    if sw > 0u {
        kv_put(which, base + item, pack2x16float(vec2<f32>(d0, d1)));
    }
}
