// RMS norms of whole rows outside a linear layer (Gemma 3), one invocation per row:
//   head_norm (in place): data[t, h, :] = rms(data[t, h, :]) * w   for the step's tokens t and
//       heads h < params.rows: data [max_tokens, stride] f32 holds a token's heads at offsets
//       h * width (QK-norm of each query and key head before RoPE).
//   add_normed (ADD): dst[t, :] += rms(src[t, :]) * w   for the step's tokens (a sub-layer's
//       output normalised before it joins the residual stream).
//   layer_norm (LAYER, in place): data[t, :] = (v - mean) / sqrt(var + eps) * w + b, v =
//       data[t, :] (BERT's post-norms after the residual sum; b: [width] f32).
// rms(v) = v / sqrt(mean(v^2) + eps); w: [width] f32. Grid: (ceil(rows / WG_SIZE), n_tokens).
// The sums run in one loop per row in order, as the CPU reference does.

struct Params {
    // values per row
    width: u32,
    // rows per token (heads; 1 for add_normed)
    rows: u32,
    // floats between two tokens' rows
    stride: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
#include "step.wgsl"
@group(0) @binding(2) var<storage, read> w: array<f32>;
#ifdef ADD
@group(0) @binding(3) var<storage, read> src: array<f32>;
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;
#else
@group(0) @binding(3) var<storage, read_write> data: array<f32>;
#endif
#ifdef LAYER
@group(0) @binding(4) var<storage, read> b: array<f32>;
#endif

fn row_value(i: u32) -> f32 {
#ifdef ADD
    return src[i];
#else
    return data[i];
#endif
}

@compute @workgroup_size(WG_SIZE)
fn row_norm(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let row = wid.x * WG_SIZE + lid;
    let t = wid.y;
    if row >= params.rows || t >= step_params.n_tokens {
        return;
    }
    let base = t * params.stride + row * params.width;
#ifdef LAYER
    // the mean is summed around the row's first value, so a row far from 0 (a residual
    // stream's offset) loses no digits to the sum's magnitude
    let shift = data[base];
    var sum = 0.0;
    for (var c = 0u; c < params.width; c++) {
        sum += data[base + c] - shift;
    }
    let mean = shift + sum / f32(params.width);
    var var_sum = 0.0;
    for (var c = 0u; c < params.width; c++) {
        let v = data[base + c] - mean;
        var_sum += v * v;
    }
    let inv_sd = inverseSqrt(var_sum / f32(params.width) + params.eps);
    for (var c = 0u; c < params.width; c++) {
        data[base + c] = (data[base + c] - mean) * inv_sd * w[c] + b[c];
    }
#else
    var sq = 0.0;
    for (var c = 0u; c < params.width; c++) {
        let v = row_value(base + c);
        sq += v * v;
    }
    let inv = inverseSqrt(sq / f32(params.width) + params.eps);
    for (var c = 0u; c < params.width; c++) {
        let v = row_value(base + c) * inv * w[c];
#ifdef ADD
        dst[base + c] = dst[base + c] + v;
#else
        data[base + c] = v;
#endif
    }
#endif
}
