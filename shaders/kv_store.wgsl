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

fn put(which: u32, i: u32, w: u32) {
    if which == 0u {
        k_cache[i] = w;
    } else {
        v_cache[i] = w;
    }
}

#include "kv_kind.wgsl"

// Value c of token t's K (0) or V (1) row; 0 past the row (padding of the last block).
fn src_at(which: u32, t: u32, c: u32) -> f32 {
    if c >= params.kv_dim {
        return 0.0;
    }
    if which == 0u {
        return k_src[t * params.k_stride + params.k_off + c];
    }
    return v_src[t * params.v_stride + params.v_off + c];
}

// GGUF-style rounding: half away from zero.
fn round_away(v: f32) -> f32 {
    return sign(v) * floor(abs(v) + 0.5);
}

// The NF4 code of v in [-1, 1]: the nearest level, the lower on a tie.
fn nf4_code(v: f32) -> u32 {
    var code = 0u;
    for (var i = 0u; i < 15u; i++) {
        if v > (nf4_levels[i] + nf4_levels[i + 1u]) * 0.5 {
            code = i + 1u;
        }
    }
    return code;
}

// Encodes block b of token t's row into the row at word `base` (scale words `sw`); returns
// the block's scale (0 for kinds without scales).
fn encode_block(which: u32, kind: u32, t: u32, b: u32, base: u32, sw: u32) -> f32 {
    let c0 = b * 32u;
    if kind == KV_F32 {
        for (var i = 0u; i < 32u; i++) {
            let c = c0 + i;
            if c < params.kv_dim {
                put(which, base + c, bitcast<u32>(src_at(which, t, c)));
            }
        }
        return 0.0;
    }
    if kind == KV_F16 {
        for (var i = 0u; i < 32u; i += 2u) {
            let c = c0 + i;
            if c < params.kv_dim {
                let pair = vec2<f32>(src_at(which, t, c), src_at(which, t, c + 1u));
                put(which, base + c / 2u, pack2x16float(clamp(pair, vec2<f32>(-65504.0),
                    vec2<f32>(65504.0))));
            }
        }
        return 0.0;
    }
    var amax = 0.0;
    var max_v = 0.0;
    for (var i = 0u; i < 32u; i++) {
        let v = src_at(which, t, c0 + i);
        if abs(v) > amax {
            amax = abs(v);
            max_v = v;
        }
    }
    var d = amax;
    if kind == KV_Q8_0 {
        d = amax / 127.0;
    } else if kind == KV_Q4_0 {
        d = max_v / -8.0;
    }
    let id = select(0.0, 1.0 / d, d != 0.0);
    if kind == KV_Q8_0 {
        for (var w = 0u; w < 8u; w++) {
            var word = 0u;
            for (var k = 0u; k < 4u; k++) {
                let q = clamp(round_away(src_at(which, t, c0 + 4u * w + k) * id), -127.0, 127.0);
                word |= (bitcast<u32>(i32(q)) & 0xffu) << (8u * k);
            }
            put(which, base + sw + b * 8u + w, word);
        }
        return d;
    }
    for (var w = 0u; w < 4u; w++) {
        var word = 0u;
        for (var k = 0u; k < 8u; k++) {
            let v = src_at(which, t, c0 + 8u * w + k) * id;
            var code: u32;
            if kind == KV_Q4_0 {
                code = min(u32(max(v + 8.5, 0.0)), 15u);
            } else {
                code = nf4_code(v);
            }
            word |= code << (4u * k);
        }
        put(which, base + sw + b * 4u + w, word);
    }
    return d;
}

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
    let d0 = encode_block(which, kind, t, b, base, sw);
    var d1 = 0.0;
    if b + 1u < blocks {
        d1 = encode_block(which, kind, t, b + 1u, base, sw);
    }
    if sw > 0u {
        put(which, base + item, pack2x16float(vec2<f32>(d0, d1)));
    }
}
