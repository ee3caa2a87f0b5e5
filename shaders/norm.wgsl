// Normalisations over the last dimension.
// rms_norm: y[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * weight
// x, y: [n_rows, n], weight: [n]. One workgroup per row, numbered across x and y.
#include "reduce.wgsl"

struct Params {
    n: u32,
    n_rows: u32,
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(WG_SIZE)
fn rms_norm(
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
    let row = wid.x + wid.y * nwg.x;
    if row >= params.n_rows {
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
