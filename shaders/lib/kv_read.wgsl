// How the attention kernels read a KV cache of other kinds than f32 (KV_KINDS; the f32 cache
// is read directly by each kernel): bindings 3 (K) and 4 (V) are u32 words in the kinds
// K_KIND and V_KIND (kv_kind.wgsl), decoded on the fly.
//   cache4(which, j, e, n): values e .. e + 3 of cached row j of K (0) or V (1), of which
//                           only the first n are read (the rest are 0: past the head); with
//                           KV_VEC4 e and the head's length are multiples of 4 and n is 4;
//   cache1(which, j, e):    value e of row j.
// Needs attention_common.wgsl (params) first.

#ifdef KV_KINDS
@group(0) @binding(3) var<storage, read> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read> v_cache: array<u32>;

fn kv_word(which: u32, i: u32) -> u32 {
    if which == 0u {
        return k_cache[i];
    }
    return v_cache[i];
}

#include "kv_kind.wgsl"

// (row words, scale words) of the K (0) or V (1) cache.
fn kv_geometry(which: u32) -> vec2<u32> {
    let kind = kv_kind(which);
    let kv_dim = params.n_kv_heads * params.head_dim;
    return vec2<u32>(kv_row_words(kind, kv_dim), kv_scale_words(kind, kv_dim));
}

fn cache4(which: u32, j: u32, e: u32, n: u32) -> vec4<f32> {
    let g = kv_geometry(which);
#ifdef KV_VEC4
    return kv_load4(which, j * g.x, g.y, e);
#else
    var out = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if c < n {
            out[c] = kv_load1(which, j * g.x, g.y, e + c);
        }
    }
    return out;
#endif
}

fn cache1(which: u32, j: u32, e: u32) -> f32 {
    let g = kv_geometry(which);
    return kv_load1(which, j * g.x, g.y, e);
}
#endif
