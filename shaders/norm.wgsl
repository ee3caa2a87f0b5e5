// Normalisations over the last dimension, one workgroup per token of the step.
// rms_norm:   y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * weight
// layer_norm: y[t, :] = (x[t, :] - mean) / sqrt(var + eps) * weight + bias
//             (population variance, computed from the deviations in a second pass: the
//             one-pass E[x^2] - E[x]^2 cancels catastrophically when |mean| >> spread)
// x, y: [max_tokens, n], weight, bias: [n]; rows t < step_params.n_tokens are computed.
#include "reduce.wgsl"

struct Params {
    n: u32,
    eps: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
#include "step.wgsl"
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
// Only layer_norm uses it, so only its (derived) pipeline layout has binding 5.
@group(0) @binding(5) var<storage, read> bias: array<f32>;

@compute @workgroup_size(WG_SIZE)
fn rms_norm(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
#ifdef SUBGROUPS
    @builtin(subgroup_invocation_id) lane: u32,
#endif
) {
#ifndef SUBGROUPS
    let lane = 0u;
#endif
    let row = wid.y;
    if row >= step_params.n_tokens {
        return;
    }
    let n = params.n;
    let base = row * n;
    var sum_sq = 0.0;
    for (var i = lid; i < n; i += WG_SIZE) {
        let v = x[base + i];
        sum_sq += v * v;
    }
    let total = workgroup_sum(vec4<f32>(sum_sq, 0.0, 0.0, 0.0), lid, lane).x;
    let scale = inverseSqrt(total / f32(n) + params.eps);
    for (var i = lid; i < n; i += WG_SIZE) {
        y[base + i] = x[base + i] * scale * weight[i];
    }
}

@compute @workgroup_size(WG_SIZE)
fn layer_norm(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
#ifdef SUBGROUPS
    @builtin(subgroup_invocation_id) lane: u32,
#endif
) {
#ifndef SUBGROUPS
    let lane = 0u;
#endif
    let row = wid.y;
    if row >= step_params.n_tokens {
        return;
    }
    let n = params.n;
    let base = row * n;
    var sum = 0.0;
    for (var i = lid; i < n; i += WG_SIZE) {
        sum += x[base + i];
    }
    let mean = workgroup_sum(vec4<f32>(sum, 0.0, 0.0, 0.0), lid, lane).x / f32(n);
    var sum_sq = 0.0;
    for (var i = lid; i < n; i += WG_SIZE) {
        let d = x[base + i] - mean;
        sum_sq += d * d;
    }
    let var_ = workgroup_sum(vec4<f32>(sum_sq, 0.0, 0.0, 0.0), lid, lane).x / f32(n);
    let scale = inverseSqrt(var_ + params.eps);
    for (var i = lid; i < n; i += WG_SIZE) {
        y[base + i] = (x[base + i] - mean) * scale * weight[i] + bias[i];
    }
}
