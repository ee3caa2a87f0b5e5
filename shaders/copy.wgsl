// Buffer copy, used to measure the adapter's memory bandwidth (the roofline decode is held
// against). One invocation per vec4<u32>; the grid may spread over y when x is at its limit.
//   copy_vec4: dst[i] = src[i] for i < n
// src, dst: [n] vec4<u32>.

struct Params {
    n: u32,
    row: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;

@compute @workgroup_size(WG_SIZE)
fn copy_vec4(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * params.row;
    if (i < params.n) {
        dst[i] = src[i];
    }
}
