// Causal grouped-query attention in the shape that suits CPU-like adapters: no barrier, no
// workgroup memory, and each invocation owning one (query head, token) whole. The same math as
// attention.wgsl (see there for shapes): the invocation keeps its scaled query and its output
// accumulator in private memory and walks the keys 0..=p once with an online softmax,
// rescaling only when the running maximum grows. Invocations of a workgroup take neighbouring
// heads of the same token, so heads sharing a KV head read the same keys (a broadcast).
// Workgroup: RWG_SIZE heads of one token; grid (ceil(n_heads / RWG_SIZE), n_tokens).
//
// HEAD_QUADS (ceil(head_dim / 4)) is a constant of the pipeline, not a runtime value: the loops
// over a head then have a constant trip count and are unrolled. llvmpipe bounds the iterations
// a shader's loops may run in all (about 65k, to stop runaway shaders), and a runtime-bounded
// loop per key would reach that bound at a couple of thousand keys and silently cut attention
// short. Compilers may still leave those loops rolled when the body is large (a cache kind's
// decoding, heads of 128), so the host never gives one invocation more keys than that bound
// allows (SHADER_LOOP_BUDGET, src/gpu/ops/key_split.rs): longer steps split.
//
// With SPLIT (flash-decoding), invocation (h, t, s) walks only split s's keys and writes its
// unnormalised partial to split_part (see attention_common.wgsl); attention_merge.wgsl
// combines the splits. Grid (ceil(n_heads / RWG_SIZE), n_tokens, n_splits).
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

@compute @workgroup_size(RWG_SIZE)
fn attention_rows(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let h = wid.x * RWG_SIZE + lid;
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
