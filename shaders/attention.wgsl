// Grouped-query attention over the KV cache, causal (or bidirectional for an encoder: every
// token reads the keys up to the step's last, see token_keys in attention_common.wgsl):
//   out[t, h*hd .. (h+1)*hd] = softmax_j(q[t, h] . k_cache[j, kvh] * scale) @ v_cache[j, kvh]
// for the step's tokens t < n_tokens at positions p = token_pos(t) (step.wgsl), over key
// positions j = 0..=p (with a local window W: j = p + 1 - W ..= p; key_row gives a position's
// cache row, a ring's for a local layer), with kv head
// kvh = h / (n_heads / n_kv_heads).
// q: [max_tokens, q_stride] (heads at columns 0..n_heads*hd), k_cache, v_cache:
// [max_positions, n_kv_heads*hd], out: [max_tokens, n_heads*hd].
//
// Two shapes, each a variant of the plan declared with its geometry in
// src/backend/gpu/variants/attention.rs: the workgroup shape (GPUs; described first) and,
// under ROWS_SHAPE, the rows shape (CPU-like adapters). WG_SIZE is the workgroup's
// invocations in both.
//
// The workgroup shape: one workgroup per (query head, token). Keys are walked in tiles of
// WG_SIZE with an online softmax, so shared memory is fixed whatever the context length:
//   scores: invocation i takes key start+i and computes its whole dot product against q (kept
//           in shared memory, pre-scaled); no reduction per key is needed. With KV_VEC4
//           (head_dim % 4 == 0) keys are read as vec4.
//   max:    one workgroup max per tile (subgroupMax + one slot per subgroup with SUBGROUPS,
//           a shared-memory tree without); the running max m is the same in every invocation.
//   weights p_j = exp(s_j - m) go to shared memory; each invocation keeps its own share of the
//           running sum l (rescaled by alpha = exp(m_old - m) like the outputs) and the shares
//           are added once at the end with workgroup_sum.
//   values: invocation (g, d) = (lid / hd, lid % hd) accumulates output dimension d over the
//           tile's keys g, g + groups, ... (groups = WG_SIZE / hd key groups, so V rows are
//           read by consecutive invocations, coalesced); the group partials are added at the
//           end. The host checks hd <= WG_SIZE.
//
// With SPLIT (flash-decoding, for long contexts and few tokens), workgroup (h, t, s) walks
// only the keys of split s, [lo + s * keys_per_split, lo + (s + 1) * keys_per_split) ∩ [lo, p]
// (lo: the token's first key, see attention_common.wgsl), and
// writes its unnormalised partial (running max m, sum l, the output accumulator) to `split_part`
// instead of attn_out; attention_merge.wgsl combines the splits. Grid (n_heads, n_tokens,
// n_splits).
//
// The rows shape (ROWS_SHAPE), which suits CPU-like adapters: no barrier, no workgroup
// memory, and each invocation owning one (query head, token) whole. The same math as the
// workgroup shape (see above for shapes): the invocation keeps its scaled query and its output
// accumulator in private memory and walks the keys 0..=p once with an online softmax,
// rescaling only when the running maximum grows. Invocations of a workgroup take neighbouring
// heads of the same token, so heads sharing a KV head read the same keys (a broadcast).
// Workgroup: WG_SIZE heads of one token; grid (ceil(n_heads / WG_SIZE), n_tokens).
//
// HEAD_QUADS (ceil(head_dim / 4)) is a constant of the pipeline, not a runtime value: the loops
// over a head then have a constant trip count and are unrolled. llvmpipe bounds the iterations
// a shader's loops may run in all (about 65k, to stop runaway shaders), and a runtime-bounded
// loop per key would reach that bound at a couple of thousand keys and silently cut attention
// short. Compilers may still leave those loops rolled when the body is large (a cache kind's
// decoding, heads of 128), so the host never gives one invocation more keys than that bound
// allows (SHADER_LOOP_BUDGET, src/backend/gpu/key_split.rs): longer steps split.
//
// With SPLIT (flash-decoding), invocation (h, t, s) walks only split s's keys and writes its
// unnormalised partial to split_part (see attention_common.wgsl); attention_merge.wgsl
// combines the splits. Grid (ceil(n_heads / WG_SIZE), n_tokens, n_splits).
#ifdef ROWS_SHAPE
#include "attention_common.wgsl"

@group(0) @binding(2) var<storage, read> q: array<f32>;
#ifdef KV_KINDS
#include "kv_read.wgsl"
#else
#ifdef KV_VEC4
@group(0) @binding(3) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> v_cache: array<vec4<f32>>;
#else
@group(0) @binding(3) var<storage, read> k_cache: array<f32>;
@group(0) @binding(4) var<storage, read> v_cache: array<f32>;
#endif
#endif
#ifdef SPLIT
@group(0) @binding(5) var<storage, read_write> split_part: array<f32>;
#else
@group(0) @binding(5) var<storage, read_write> attn_out: array<OutElem>;
#endif

// Four values of cache row j from element `off + 4 * i` (off: the head's first column; zeros
// past the head under scalar reads, whose head_dim need not be a multiple of 4).
fn k4(j: u32, off: u32, i: u32, hd: u32) -> vec4<f32> {
#ifdef KV_KINDS
    return cache4(0u, j, off + 4u * i, min(hd - 4u * i, 4u));
#else
    let base = j * params.n_kv_heads * hd + off;
#ifdef KV_VEC4
    return k_cache[base / 4u + i];
#else
    var out = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        let d = 4u * i + c;
        if d < hd {
            out[c] = k_cache[base + d];
        }
    }
    return out;
#endif
#endif
}

fn v4(j: u32, off: u32, i: u32, hd: u32) -> vec4<f32> {
#ifdef KV_KINDS
    return cache4(1u, j, off + 4u * i, min(hd - 4u * i, 4u));
#else
    let base = j * params.n_kv_heads * hd + off;
#ifdef KV_VEC4
    return v_cache[base / 4u + i];
#else
    var out = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        let d = 4u * i + c;
        if d < hd {
            out[c] = v_cache[base + d];
        }
    }
    return out;
#endif
#endif
}

fn score(j: u32, off: u32, hd: u32, qv: ptr<function, array<vec4<f32>, HEAD_QUADS>>) -> f32 {
    var s4 = vec4<f32>(0.0);
    for (var i = 0u; i < HEAD_QUADS; i++) {
        s4 += (*qv)[i] * k4(j, off, i, hd);
    }
    return (s4.x + s4.y) + (s4.z + s4.w);
}

@compute @workgroup_size(WG_SIZE)
fn attention(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let h = wid.x * WG_SIZE + lid;
    let t = wid.y;
    if h >= params.n_heads || t >= step_params.n_tokens {
        return;
    }
    let hd = params.head_dim;
    let kv_off = (h / (params.n_heads / params.n_kv_heads)) * hd;
    let keys = split_keys(wid.z, t);

    var qv: array<vec4<f32>, HEAD_QUADS>;
    let q_base = t * params.q_stride + h * hd;
    for (var d = 0u; d < hd; d++) {
        qv[d / 4u][d % 4u] = q[q_base + d] * params.scale;
    }
    var acc: array<vec4<f32>, HEAD_QUADS>;
    var m = NEG_BIG;
    var l = 0.0;
    for (var k = keys.x; k < keys.y; k++) {
        let j = key_row(t, k);
        let s = score(j, kv_off, hd, &qv);
        if s > m {
            // rescale what was summed under the old maximum (nothing at the first key, where
            // exp(NEG_BIG - s) underflows to 0)
            let alpha = exp(m - s);
            l *= alpha;
            for (var i = 0u; i < HEAD_QUADS; i++) {
                acc[i] *= alpha;
            }
            m = s;
        }
        let p = exp(s - m);
        l += p;
        for (var i = 0u; i < HEAD_QUADS; i++) {
            acc[i] += p * v4(j, kv_off, i, hd);
        }
    }
#ifdef SPLIT
    let r = partial_index(t, h, wid.z);
    for (var d = 0u; d < hd; d++) {
        split_part[r + d] = acc[d / 4u][d % 4u];
    }
    split_part[r + hd] = m;
    split_part[r + hd + 1u] = l;
#else
    let inv_l = 1.0 / l;
    let out_base = t * params.n_heads * hd + h * hd;
    for (var d = 0u; d < hd; d++) {
        attn_out[out_base + d] = out_value(acc[d / 4u][d % 4u] * inv_l);
    }
#endif
}
#else
#include "reduce.wgsl"
#include "attention_common.wgsl"

@group(0) @binding(2) var<storage, read> q: array<f32>;
#ifdef KV_KINDS
#include "kv_read.wgsl"
#else
#ifdef KV_VEC4
@group(0) @binding(3) var<storage, read> k_cache: array<vec4<f32>>;
#else
@group(0) @binding(3) var<storage, read> k_cache: array<f32>;
#endif
@group(0) @binding(4) var<storage, read> v_cache: array<f32>;
#endif
#ifdef SPLIT
@group(0) @binding(5) var<storage, read_write> split_part: array<f32>;
#else
@group(0) @binding(5) var<storage, read_write> attn_out: array<OutElem>;
#endif

// The query, times 1/sqrt(hd), as vec4s (dimension d at [d / 4][d % 4]).
var<workgroup> q_sh: array<vec4<f32>, MAX_HEAD_DIM / 4u>;
// The tile's softmax weights; at the end, the key groups' output partials.
var<workgroup> p_sh: array<f32, WG_SIZE>;
// Tile max: per-subgroup maxima (SUBGROUPS) or the tree's levels.
var<workgroup> max_sh: array<f32, WG_SIZE>;
#ifdef SUBGROUPS
var<workgroup> max_count: atomic<u32>;
#endif

// Maximum of `v` over the workgroup, returned to every invocation; uniform control flow only.
// Max is exact, so unlike workgroup_sum the order of the partials does not matter.
fn workgroup_max(v: f32, lid: u32, lane: u32) -> f32 {
#ifdef SUBGROUPS
    if lid == 0u {
        atomicStore(&max_count, 0u);
    }
    workgroupBarrier();
    let m = subgroupMax(v);
    if lane == 0u {
        max_sh[atomicAdd(&max_count, 1u)] = m;
    }
    workgroupBarrier();
    let n = atomicLoad(&max_count);
    var total = max_sh[0];
    for (var j = 1u; j < n; j++) {
        total = max(total, max_sh[j]);
    }
    workgroupBarrier();
    return total;
#else
    max_sh[lid] = v;
    workgroupBarrier();
    for (var stride = WG_SIZE / 2u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            max_sh[lid] = max(max_sh[lid], max_sh[lid + stride]);
        }
        workgroupBarrier();
    }
    let total = max_sh[0];
    workgroupBarrier();
    return total;
#endif
}

// q . k for key j, whose head starts at column `off` of its cache row.
fn score(j: u32, off: u32, hd: u32) -> f32 {
#ifdef KV_KINDS
    var acc = vec4<f32>(0.0);
    for (var d = 0u; d < hd; d += 4u) {
        acc += q_sh[d / 4u] * cache4(0u, j, off + d, min(hd - d, 4u));
    }
    return (acc.x + acc.y) + (acc.z + acc.w);
#else
    let kb = j * params.n_kv_heads * hd + off;
#ifdef KV_VEC4
    var acc = vec4<f32>(0.0);
    let k4 = kb / 4u;
    for (var d = 0u; d < hd / 4u; d++) {
        acc += q_sh[d] * k_cache[k4 + d];
    }
    return (acc.x + acc.y) + (acc.z + acc.w);
#else
    var acc = 0.0;
    for (var d = 0u; d < hd; d++) {
        acc += q_sh[d / 4u][d % 4u] * k_cache[kb + d];
    }
    return acc;
#endif
#endif
}

// Value column c of cached row j.
fn value_at(j: u32, c: u32) -> f32 {
#ifdef KV_KINDS
    return cache1(1u, j, c);
#else
    return v_cache[j * params.n_kv_heads * params.head_dim + c];
#endif
}

@compute @workgroup_size(WG_SIZE)
fn attention(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
#ifdef SUBGROUPS
    @builtin(subgroup_invocation_id) lane: u32,
#endif
) {
#ifndef SUBGROUPS
    let lane = 0u;
#endif
    let h = wid.x;
    let t = wid.y;
    if t >= step_params.n_tokens {
        return;
    }
    let hd = params.head_dim;
    let kv_off = (h / (params.n_heads / params.n_kv_heads)) * hd;
    let keys = split_keys(wid.z, t);
    let first_key = keys.x;
    let n_keys = keys.y;

    let q_base = t * params.q_stride + h * hd;
    for (var d = lid; d < hd; d += WG_SIZE) {
        q_sh[d / 4u][d % 4u] = q[q_base + d] * params.scale;
    }
    workgroupBarrier();

    let groups = WG_SIZE / hd;
    let g = lid / hd;
    let d = lid % hd;
    var acc = 0.0;
    var m = NEG_BIG;
    var l = 0.0;
    for (var start = first_key; start < n_keys; start += WG_SIZE) {
        let j = start + lid;
        var s = NEG_BIG;
        if j < n_keys {
            s = score(key_row(t, j), kv_off, hd);
        }
        let m_new = max(m, workgroup_max(s, lid, lane));
        // first tile: nothing to rescale (and m - m_new may not be finite)
        let alpha = select(exp(m - m_new), 0.0, start == first_key);
        let p = select(0.0, exp(s - m_new), j < n_keys);
        l = l * alpha + p;
        p_sh[lid] = p;
        workgroupBarrier();
        acc *= alpha;
        if g < groups {
            let tile = min(WG_SIZE, n_keys - start);
            for (var kk = g; kk < tile; kk += groups) {
                acc += p_sh[kk] * value_at(key_row(t, start + kk), kv_off + d);
            }
        }
        // p_sh is rewritten by the next tile
        workgroupBarrier();
        m = m_new;
    }
    let l_total = workgroup_sum(vec4<f32>(l, 0.0, 0.0, 0.0), lid, lane).x;

    // add the key groups' partials, in group order
    if g < groups {
        p_sh[lid] = acc;
    }
    workgroupBarrier();
    if g == 0u {
        var total = 0.0;
        for (var gg = 0u; gg < groups; gg++) {
            total += p_sh[gg * hd + d];
        }
#ifdef SPLIT
        let r = partial_index(t, h, wid.z);
        split_part[r + d] = total;
        if d == 0u {
            split_part[r + hd] = m;
            split_part[r + hd + 1u] = l_total;
        }
#else
        attn_out[t * params.n_heads * hd + h * hd + d] = out_value(total * (1.0 / l_total));
#endif
    }
}
#endif
