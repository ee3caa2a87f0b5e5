// The SwiGLU gate over the step's tokens, one invocation per value; the grid is
// (ceil(n / WG_SIZE), n_tokens). Rows t >= step_params.n_tokens are left alone.
//   swiglu: dst[t, i] = silu(src0[t, in_off0 + i]) * src1[t, in_off1 + i]
//           (gelu_tanh for silu with GELU_GATE: GeGLU)
//           (gate = src0, up = src1; both may be the same fused [gate | up] buffer)
// dst: [max_tokens, n]; src0, src1: [max_tokens, in_stride].

struct Params {
    n: u32,
    in_stride: u32,
    in_off0: u32,
    in_off1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
#include "step.wgsl"
#ifdef OUT_F16
enable f16;
// f16 output (precision f16): the down projection reads it as its f16 input
alias OutElem = f16;
#else
alias OutElem = f32;
#endif
@group(0) @binding(2) var<storage, read_write> dst: array<OutElem>;
@group(0) @binding(3) var<storage, read> src0: array<f32>;
@group(0) @binding(4) var<storage, read> src1: array<f32>;

#include "activation.wgsl"

@compute @workgroup_size(WG_SIZE)
fn swiglu(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let i = wid.x * WG_SIZE + lid;
    let t = wid.y;
    if i >= params.n || t >= step_params.n_tokens {
        return;
    }
    let src = t * params.in_stride + i;
#ifdef GELU_GATE
    let gate = gelu_tanh(src0[src + params.in_off0]);
#else
    let gate = silu(src0[src + params.in_off0]);
#endif
    let v = gate * src1[src + params.in_off1];
#ifdef OUT_F16
    dst[t * params.n + i] = OutElem(clamp(v, -65504.0, 65504.0));
#else
    dst[t * params.n + i] = v;
#endif
}
