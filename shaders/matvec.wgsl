// Matrix × vector (decode-time linear layers), f32 weights:
//   y[r] = sum_c w[r, c] * x[c]  (+ bias[r] with HAS_BIAS)
// w: [rows, cols] row-major, x: [cols], y: [rows], bias: [rows].
// A workgroup computes ROWS consecutive rows. Its invocations walk the columns with stride
// WG_SIZE, so neighbouring invocations read neighbouring weights (coalesced), and each x[c] is
// loaded once for all ROWS rows; the ROWS partial sums are reduced together as one vec4.
// Workgroups are numbered across x and y so that more than 65535 of them can be dispatched.
#include "reduce.wgsl"

struct Params {
    rows: u32,
    cols: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
#ifdef HAS_BIAS
@group(0) @binding(4) var<storage, read> bias: array<f32>;
#endif

const ROWS: u32 = 4u;

@compute @workgroup_size(WG_SIZE)
fn matvec_f32(
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
    let row0 = (wid.x + wid.y * nwg.x) * ROWS;
    if row0 >= params.rows {
        return;
    }
    let live = min(ROWS, params.rows - row0);
    let cols = params.cols;
    let base = row0 * cols;
    var acc = vec4<f32>(0.0);
    for (var c = lid; c < cols; c += WG_SIZE) {
        let xc = x[c];
        acc.x += w[base + c] * xc;
        if live > 1u {
            acc.y += w[base + cols + c] * xc;
        }
        if live > 2u {
            acc.z += w[base + 2u * cols + c] * xc;
        }
        if live > 3u {
            acc.w += w[base + 3u * cols + c] * xc;
        }
    }
    let total = workgroup_sum(acc, lid, lane);
    if lid < live {
        var v = total[lid];
#ifdef HAS_BIAS
        v += bias[row0 + lid];
#endif
        y[row0 + lid] = v;
    }
}
