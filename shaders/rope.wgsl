// Rotary position embedding fused with the KV-cache write, for the step's tokens
// t < step_params.n_tokens at positions p = token_pos(t) (cache row cache_row(t, p, ring)):
//   q[t] is rotated in place; k[t] is rotated and written to k_cache[p]; v[t] is copied to
//   v_cache[p]. With NO_ROPE (GPT-2) nothing is rotated: k and v are only copied.
// Pair i of a head (of head_dim / 2) is rotated by p * theta^(-2i / head_dim) radians; it
// holds dimensions (2i, 2i + 1), or (i, i + head_dim / 2) with ROTATE_HALF.
// q: [max_tokens, q_stride] (heads at columns 0..n_heads*hd), k, v: [max_tokens, *_stride]
// (heads from k_off / v_off), k_cache, v_cache: [rows, n_kv_heads * head_dim] (rows:
// max_positions per sequence, or a local layer's ring).
// One invocation per rotated pair or copied value; the grid is (items / WG_SIZE, n_tokens).
// With KV_DEFER (caches of other kinds than f32) q and k are only rotated in place, and
// kv_store.wgsl encodes k and v into the caches after.
//
// The angle. p * freq in f32 is off by up to ulp(p * freq) / 2 (2.4e-4 rad at p = 4096, 4e-3
// at 65536) before sin/cos even start, and WGSL only promises sin/cos to 2^-11 on [-pi, pi].
// Instead the host passes freq / (2 pi) (turns per position) as a 0.64 fixed-point number
// (hi, lo) computed in f64; p * freq mod 1 turn is then exact integer arithmetic (wrapping u32
// products), its top 32 bits are the angle's fraction of a turn, and sin/cos come from a
// quadrant and a polynomial on [-pi/4, pi/4]. The angle is within ~1e-7 rad of the f64 one at
// every position below 2^32, on every GPU.

struct Params {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    max_positions: u32,
    q_stride: u32,
    k_off: u32,
    k_stride: u32,
    v_off: u32,
    v_stride: u32,
    // rows per sequence of a local layer's ring (0: every position kept; cache_row)
    ring: u32,
    _pad1: u32,
    _pad2: u32,
    // pair i: (hi, lo) of its turns per position at freqs[i / 2][2 * (i % 2)], [.. + 1]
    freqs: array<vec4<u32>, FREQ_VEC4S>,
}

@group(0) @binding(0) var<uniform> params: Params;
#include "step.wgsl"
#ifdef NO_ROPE
// q is not touched without RoPE, so it is not bound.
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<f32>;
#else
#ifdef KV_DEFER
// Rotation only: k is rotated in place and kv_store.wgsl writes the caches.
@group(0) @binding(2) var<storage, read_write> q: array<f32>;
@group(0) @binding(3) var<storage, read_write> k: array<f32>;
#else
@group(0) @binding(2) var<storage, read_write> q: array<f32>;
@group(0) @binding(3) var<storage, read> k: array<f32>;
@group(0) @binding(4) var<storage, read> v: array<f32>;
@group(0) @binding(5) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<f32>;
#endif
#endif
fn load_k(i: u32) -> f32 {
    return k[i];
}
#ifndef KV_DEFER
fn load_v(i: u32) -> f32 {
    return v[i];
}
#endif

#include "rope_angle.wgsl"

// (sin, cos) of pair `i`'s angle at position `pos`.
fn rope_sin_cos(pos: u32, i: u32) -> vec2<f32> {
    let f = params.freqs[i / 2u];
    let hi = select(f.x, f.z, (i & 1u) == 1u);
    let lo = select(f.y, f.w, (i & 1u) == 1u);
    return rope_sin_cos_fixed(pos, hi, lo);
}

// Offsets within a head of the two dimensions of pair `i`.
fn pair_dims(i: u32) -> vec2<u32> {
#ifdef ROTATE_HALF
    return vec2<u32>(i, i + params.head_dim / 2u);
#else
    return vec2<u32>(2u * i, 2u * i + 1u);
#endif
}

@compute @workgroup_size(WG_SIZE)
fn rope_kv_write(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let t = wid.y;
    let pos = token_pos(t);
    // positions past the cache were refused on the host; never write outside it anyway
    if t >= step_params.n_tokens || pos >= params.max_positions {
        return;
    }
    let hd = params.head_dim;
    let kv_dim = params.n_kv_heads * hd;
    var item = wid.x * WG_SIZE + lid;
    let cache_at = cache_row(t, pos, params.ring) * kv_dim;
#ifndef NO_ROPE
    let n_pairs = hd / 2u;
    let q_pairs = params.n_heads * n_pairs;
    if item < q_pairs {
        let head = item / n_pairs;
        let i = item % n_pairs;
        let d = pair_dims(i);
        let base = t * params.q_stride + head * hd;
        let x0 = q[base + d.x];
        let x1 = q[base + d.y];
        let sc = rope_sin_cos(pos, i);
        q[base + d.x] = x0 * sc.y - x1 * sc.x;
        q[base + d.y] = x0 * sc.x + x1 * sc.y;
        return;
    }
    item -= q_pairs;
    let k_pairs = params.n_kv_heads * n_pairs;
    if item < k_pairs {
        let head = item / n_pairs;
        let i = item % n_pairs;
        let d = pair_dims(i);
        let src = t * params.k_stride + params.k_off + head * hd;
        let x0 = load_k(src + d.x);
        let x1 = load_k(src + d.y);
        let sc = rope_sin_cos(pos, i);
#ifdef KV_DEFER
        k[src + d.x] = x0 * sc.y - x1 * sc.x;
        k[src + d.y] = x0 * sc.x + x1 * sc.y;
#else
        let dst = cache_at + head * hd;
        k_cache[dst + d.x] = x0 * sc.y - x1 * sc.x;
        k_cache[dst + d.y] = x0 * sc.x + x1 * sc.y;
#endif
        return;
    }
    item -= k_pairs;
#else
    if item < kv_dim {
        k_cache[cache_at + item] = load_k(t * params.k_stride + params.k_off + item);
        return;
    }
    item -= kv_dim;
#endif
#ifndef KV_DEFER
    if item < kv_dim {
        v_cache[cache_at + item] = load_v(t * params.v_stride + params.v_off + item);
    }
#endif
}
