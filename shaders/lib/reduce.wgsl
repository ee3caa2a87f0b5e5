// Workgroup-wide sums of vec4<f32>, included by kernels that reduce (dot products, norms).
// Needs `const WG_SIZE` (a power of two). With the SUBGROUPS define, each subgroup adds its
// values with subgroupAdd and only one partial per subgroup goes through shared memory;
// without it, a shared-memory tree takes log2(WG_SIZE) barriers.
// No `enable subgroups;` directive: wgpu's shader compiler rejects it natively, and in the
// browser wgpu 30 cannot request the `subgroups` feature, so SUBGROUPS is never set there.

var<workgroup> reduce_partial: array<vec4<f32>, WG_SIZE>;
#ifdef SUBGROUPS
var<workgroup> reduce_ordered: array<vec4<f32>, WG_SIZE>;
var<workgroup> reduce_key: array<u32, WG_SIZE>;
var<workgroup> reduce_count: atomic<u32>;
#endif
// With REDUCE_PAIR, workgroup_sum_pair sums two vec4s through the same barriers.
#ifdef REDUCE_PAIR
var<workgroup> reduce_partial_b: array<vec4<f32>, WG_SIZE>;
#ifdef SUBGROUPS
var<workgroup> reduce_ordered_b: array<vec4<f32>, WG_SIZE>;
#endif
#endif

// Sum of `v` over every invocation of the workgroup, returned to all of them.
// `lid` is local_invocation_index; `lane` is subgroup_invocation_id (unused without SUBGROUPS).
// Must be called from uniform control flow.
fn workgroup_sum(v: vec4<f32>, lid: u32, lane: u32) -> vec4<f32> {
#ifdef SUBGROUPS
    if lid == 0u {
        atomicStore(&reduce_count, 0u);
    }
    workgroupBarrier();
    let s = subgroupAdd(v);
    // Nothing is assumed about how invocations map to subgroups: each subgroup claims a slot
    // and records its smallest invocation index as a key...
    let key = subgroupMin(lid);
    if lane == 0u {
        let slot = atomicAdd(&reduce_count, 1u);
        reduce_partial[slot] = s;
        reduce_key[slot] = key;
    }
    workgroupBarrier();
    let n = atomicLoad(&reduce_count);
    // ...and the partials are put in key order, so the result does not depend on which
    // subgroup arrived first (same inputs, same bits).
    if lid < n {
        let mine = reduce_key[lid];
        var rank = 0u;
        for (var j = 0u; j < n; j++) {
            rank += select(0u, 1u, reduce_key[j] < mine);
        }
        reduce_ordered[rank] = reduce_partial[lid];
    }
    workgroupBarrier();
    var total = vec4<f32>(0.0);
    for (var j = 0u; j < n; j++) {
        total += reduce_ordered[j];
    }
    workgroupBarrier();
    return total;
#else
    reduce_partial[lid] = v;
    workgroupBarrier();
    for (var stride = WG_SIZE / 2u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            reduce_partial[lid] += reduce_partial[lid + stride];
        }
        workgroupBarrier();
    }
    let total = reduce_partial[0];
    workgroupBarrier();
    return total;
#endif
}

#ifdef REDUCE_PAIR
// workgroup_sum of `a` and of `b` at once (same order of additions as workgroup_sum, so each
// result has the same bits as a workgroup_sum of its own), for the cost of one.
fn workgroup_sum_pair(a: vec4<f32>, b: vec4<f32>, lid: u32, lane: u32) -> array<vec4<f32>, 2> {
#ifdef SUBGROUPS
    if lid == 0u {
        atomicStore(&reduce_count, 0u);
    }
    workgroupBarrier();
    let sa = subgroupAdd(a);
    let sb = subgroupAdd(b);
    let key = subgroupMin(lid);
    if lane == 0u {
        let slot = atomicAdd(&reduce_count, 1u);
        reduce_partial[slot] = sa;
        reduce_partial_b[slot] = sb;
        reduce_key[slot] = key;
    }
    workgroupBarrier();
    let n = atomicLoad(&reduce_count);
    if lid < n {
        let mine = reduce_key[lid];
        var rank = 0u;
        for (var j = 0u; j < n; j++) {
            rank += select(0u, 1u, reduce_key[j] < mine);
        }
        reduce_ordered[rank] = reduce_partial[lid];
        reduce_ordered_b[rank] = reduce_partial_b[lid];
    }
    workgroupBarrier();
    var ta = vec4<f32>(0.0);
    var tb = vec4<f32>(0.0);
    for (var j = 0u; j < n; j++) {
        ta += reduce_ordered[j];
        tb += reduce_ordered_b[j];
    }
    workgroupBarrier();
    return array<vec4<f32>, 2>(ta, tb);
#else
    reduce_partial[lid] = a;
    reduce_partial_b[lid] = b;
    workgroupBarrier();
    for (var stride = WG_SIZE / 2u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            reduce_partial[lid] += reduce_partial[lid + stride];
            reduce_partial_b[lid] += reduce_partial_b[lid + stride];
        }
        workgroupBarrier();
    }
    let ta = reduce_partial[0];
    let tb = reduce_partial_b[0];
    workgroupBarrier();
    return array<vec4<f32>, 2>(ta, tb);
#endif
}
#endif
