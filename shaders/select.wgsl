// Candidate selection for sampling: one workgroup reads one logits row and writes a compact
// result (at most 4 KB) that the CPU sampler can draw from instead of the whole row.
//
//   logits: [n] raw logits from element params.offset (one row of the step's logits)
//   adjust: [n_adjust] sparse adjustments (bias, repetition, presence/frequency), distinct ids
//   work:   [n] scratch, the adjusted row
//   out:    header [16] + k x (id, adjusted bits, raw bits) + n_adjust x raw bits
//   allow:  [ceil(n / 32)] a constraint's bitset (bit i % 32 of word i / 32: token i allowed),
//           read when req.masked is 1
//
// Steps: copy the row to `work` (raw max, non-finite flag); apply the adjustments in the
// sampler's order (bias, then repetition, then presence/frequency, saturating at +-f32::MAX);
// with a mask, set every forbidden token to -f32::MAX (below every allowed one; its exp in the
// tail sums underflows to 0);
// radix-select the k-th largest adjusted value over an order-preserving u32 key, 8 bits per
// round with a 256-bin histogram in workgroup atomics; when the values tie at the threshold,
// radix-select the lowest ids among the tied; gather the k winners and sort them (bitonic) by
// value descending, ties to the lower id. Sums: sum exp(raw - raw max) over the row, and
// sum exp((adjusted - adjusted max) * inv_temp) over the tokens not selected (the tail), and
// over the adjusted tokens not selected.
//
// Every round reads the row with consecutive invocations on consecutive elements (coalesced).
// Needs WG_SIZE == 256 (one histogram bin and one sort slot per invocation).

struct Params {
    // Length of the logits and work buffers (upper bound for n).
    capacity: u32,
    // First element of the row in `logits` (row index times capacity).
    offset: u32,
    _pad1: u32,
    _pad2: u32,
}

struct Request {
    n: u32,
    k: u32,
    n_adjust: u32,
    inv_temp: f32,
    masked: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

struct Adjust {
    id: u32,
    bias: f32,
    // Factor for a positive logit after the bias (1/r for a repetition penalty r, else 1).
    pos_scale: f32,
    // Factor for a logit <= 0 after the bias (r, else 1).
    neg_scale: f32,
    // Subtracted last (presence + frequency * count).
    delta: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<uniform> req: Request;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read> adjust: array<Adjust>;
@group(0) @binding(4) var<storage, read_write> work: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<u32>;
@group(0) @binding(6) var<storage, read> allow: array<u32>;

const HEADER = 16u;
const MAX_K = 256u;
const BINS = 256u;
// f32::MAX exactly (a decimal literal may round past it, which WGSL compilers reject)
const FLT_MAX: f32 = 0x1.fffffep+127f;
const FLAG_NON_FINITE = 1u;

var<workgroup> hist: array<atomic<u32>, BINS>;
var<workgroup> scan: array<u32, BINS>;
var<workgroup> red: array<f32, WG_SIZE>;
var<workgroup> cand_key: array<u32, MAX_K>;
var<workgroup> cand_id: array<u32, MAX_K>;
var<workgroup> flags: atomic<u32>;
var<workgroup> taken: atomic<u32>;
// The radix state: bits decided so far, how many still to take inside them, and the count of
// the digit picked last.
var<workgroup> sh_prefix: u32;
var<workgroup> sh_need: u32;
var<workgroup> sh_digit_count: u32;
var<workgroup> sh_digit: u32;

fn is_finite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}

fn saturate(x: f32) -> f32 {
    return clamp(x, -FLT_MAX, FLT_MAX);
}

// An unsigned key that grows with the float; -0.0 and +0.0 get the same key.
fn ordered(x: f32) -> u32 {
    var b = bitcast<u32>(x);
    if b == 0x80000000u {
        b = 0u;
    }
    if (b >> 31u) == 1u {
        return ~b;
    }
    return b | 0x80000000u;
}

fn workgroup_max(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG_SIZE / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn workgroup_add(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG_SIZE / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn clear_histogram(lid: u32) {
    atomicStore(&hist[lid], 0u);
    workgroupBarrier();
}

// After a histogram round: finds the digit at which the running count (from the largest digit
// down when `from_top`, else from 0 up) first reaches `sh_need`; records it in `sh_digit`,
// what is still needed inside it in `sh_need` and its count in `sh_digit_count`.
fn pick_digit(lid: u32, from_top: bool) {
    let b = select(lid, BINS - 1u - lid, from_top);
    let own = atomicLoad(&hist[b]);
    scan[lid] = own;
    workgroupBarrier();
    for (var off = 1u; off < BINS; off <<= 1u) {
        var v = scan[lid];
        if lid >= off {
            v += scan[lid - off];
        }
        workgroupBarrier();
        scan[lid] = v;
        workgroupBarrier();
    }
    let inclusive = scan[lid];
    let exclusive = inclusive - own;
    let need = sh_need;
    workgroupBarrier();
    if exclusive < need && inclusive >= need {
        sh_digit = b;
        sh_need = need - exclusive;
        sh_digit_count = own;
    }
    workgroupBarrier();
}

@compute @workgroup_size(WG_SIZE)
fn select_top_k(@builtin(local_invocation_index) lid: u32) {
    let n = min(req.n, params.capacity);
    let k = min(min(req.k, n), MAX_K);
    let n_adjust = req.n_adjust;
    if lid == 0u {
        atomicStore(&flags, 0u);
        atomicStore(&taken, 0u);
    }
    cand_key[lid] = 0u;
    cand_id[lid] = 0xffffffffu;

    // Copy: raw max and the non-finite flag.
    var raw_max = -FLT_MAX;
    var bad = false;
    for (var i = lid; i < n; i += WG_SIZE) {
        let x = logits[params.offset + i];
        if is_finite(x) {
            raw_max = max(raw_max, x);
        } else {
            bad = true;
        }
        work[i] = x;
    }
    if bad {
        atomicOr(&flags, FLAG_NON_FINITE);
    }
    raw_max = workgroup_max(raw_max, lid);
    storageBarrier();

    // Adjustments, in the sampler's order; ids are distinct, so no two invocations collide.
    for (var j = lid; j < n_adjust; j += WG_SIZE) {
        let a = adjust[j];
        if a.id < n {
            var x = saturate(work[a.id] + a.bias);
            x = saturate(x * select(a.neg_scale, a.pos_scale, x > 0.0));
            x = saturate(x - a.delta);
            work[a.id] = x;
        }
    }
    storageBarrier();
    if req.masked != 0u {
        for (var i = lid; i < n; i += WG_SIZE) {
            if ((allow[i >> 5u] >> (i & 31u)) & 1u) == 0u {
                work[i] = -FLT_MAX;
            }
        }
        storageBarrier();
    }

    // Value passes, most significant digit first. The first also sums the raw row and finds
    // the adjusted max.
    if lid == 0u {
        sh_prefix = 0u;
        sh_need = max(k, 1u);
    }
    var raw_sum = 0.0;
    var adj_max = -FLT_MAX;
    var mask = 0u;
    for (var r = 0u; r < 4u; r++) {
        let shift = 24u - 8u * r;
        clear_histogram(lid);
        let prefix = sh_prefix;
        for (var i = lid; i < n; i += WG_SIZE) {
            let a = work[i];
            if r == 0u {
                raw_sum += exp(logits[params.offset + i] - raw_max);
                adj_max = max(adj_max, a);
            }
            let key = ordered(a);
            if (key & mask) == prefix {
                atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
            }
        }
        workgroupBarrier();
        pick_digit(lid, true);
        if lid == 0u {
            sh_prefix = prefix | (sh_digit << shift);
        }
        mask |= 0xffu << shift;
        workgroupBarrier();
    }
    raw_sum = workgroup_add(raw_sum, lid);
    adj_max = workgroup_max(adj_max, lid);
    let threshold = workgroupUniformLoad(&sh_prefix);

    // Ties at the threshold: keep the lowest ids among them (id passes, smallest digit first).
    var id_limit = 0xffffffffu;
    let surplus = workgroupUniformLoad(&sh_digit_count) > workgroupUniformLoad(&sh_need);
    if surplus {
        let id_bits = 32u - countLeadingZeros(max(n, 2u) - 1u);
        let passes = (id_bits + 7u) / 8u;
        if lid == 0u {
            sh_prefix = 0u;
        }
        var id_mask = 0u;
        for (var r = 0u; r < passes; r++) {
            let shift = 8u * (passes - 1u - r);
            clear_histogram(lid);
            let prefix = sh_prefix;
            for (var i = lid; i < n; i += WG_SIZE) {
                if ordered(work[i]) == threshold && (i & id_mask) == prefix {
                    atomicAdd(&hist[(i >> shift) & 0xffu], 1u);
                }
            }
            workgroupBarrier();
            pick_digit(lid, false);
            if lid == 0u {
                sh_prefix = prefix | (sh_digit << shift);
            }
            id_mask |= 0xffu << shift;
            workgroupBarrier();
        }
        id_limit = workgroupUniformLoad(&sh_prefix);
    }

    // Gather the winners; everything else goes into the tail sum.
    let inv_temp = req.inv_temp;
    var tail = 0.0;
    for (var i = lid; i < n; i += WG_SIZE) {
        let a = work[i];
        let key = ordered(a);
        if key > threshold || (key == threshold && i <= id_limit) {
            let slot = atomicAdd(&taken, 1u);
            if slot < MAX_K {
                cand_key[slot] = key;
                cand_id[slot] = i;
            }
        } else {
            tail += exp((a - adj_max) * inv_temp);
        }
    }
    tail = workgroup_add(tail, lid);

    // The adjusted tokens: their raw logits, and their share of the tail.
    var adj_tail = 0.0;
    for (var j = lid; j < n_adjust; j += WG_SIZE) {
        let id = adjust[j].id;
        var raw = 0u;
        if id < n {
            raw = bitcast<u32>(logits[params.offset + id]);
            let a = work[id];
            let key = ordered(a);
            if !(key > threshold || (key == threshold && id <= id_limit)) {
                adj_tail += exp((a - adj_max) * inv_temp);
            }
        }
        out[HEADER + 3u * k + j] = raw;
    }
    adj_tail = workgroup_add(adj_tail, lid);

    // Bitonic sort of the slots: larger key first, then lower id; empty slots sort last.
    for (var size = 2u; size <= MAX_K; size <<= 1u) {
        for (var stride = size >> 1u; stride > 0u; stride >>= 1u) {
            let other = lid ^ stride;
            if other > lid {
                let ka = cand_key[lid];
                let kb = cand_key[other];
                let ia = cand_id[lid];
                let ib = cand_id[other];
                let b_first = kb > ka || (kb == ka && ib < ia);
                let ascending = (lid & size) == 0u;
                if b_first == ascending {
                    cand_key[lid] = kb;
                    cand_key[other] = ka;
                    cand_id[lid] = ib;
                    cand_id[other] = ia;
                }
            }
            workgroupBarrier();
        }
    }

    if lid < k {
        let id = cand_id[lid];
        out[HEADER + 3u * lid] = id;
        out[HEADER + 3u * lid + 1u] = bitcast<u32>(work[id]);
        out[HEADER + 3u * lid + 2u] = bitcast<u32>(logits[params.offset + id]);
    }
    if lid == 0u {
        out[0] = atomicLoad(&flags);
        out[1] = n;
        out[2] = k;
        out[3] = n_adjust;
        out[4] = bitcast<u32>(raw_max);
        out[5] = bitcast<u32>(raw_sum);
        out[6] = bitcast<u32>(adj_max);
        out[7] = bitcast<u32>(tail);
        out[8] = bitcast<u32>(adj_tail);
        out[9] = threshold;
        out[10] = id_limit;
        out[11] = atomicLoad(&taken);
        out[12] = 0u;
        out[13] = 0u;
        out[14] = 0u;
        out[15] = 0u;
    }
}
