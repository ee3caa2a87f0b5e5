// Dequantizing row gather (token and learned position embeddings):
//   out[t, :] (+)= scale * table[id_t, :]   for t < n_tokens
// A table larger than one storage binding is bound in parts of whole rows: each dispatch holds
// rows first_row .. first_row + part_rows and writes only the tokens whose rows it holds.
// table: [rows, dim] in its stored type (see quant.wgsl), out: [max_tokens, dim] f32.
// With FROM_IDS, id_t = ids[t] (ids: u32 [max_tokens]); without, id_t = token_pos(t) (GPT-2's
// learned positions); with FIRST_ROW, id_t = 0 (BERT's token type, one segment). ACCUMULATE adds
// to out instead of overwriting it.
// An id past the table is clamped to its last row, so a bad id can never read out of bounds;
// the engine validates token ids on the CPU before uploading them.
// Grid: (parts / WG, n_tokens): one invocation per part (8 values) of one token's row, so
// neighbouring invocations read neighbouring bytes of the row. Values are the exact
// dequantization (q_dequant), so the gather is bit-exact with the CPU.
#include "quant.wgsl"

struct Params {
    rows: u32,
    dim: u32,
    max_tokens: u32,
    // Always 0; see put().
    zero: u32,
    first_row: u32,
    part_rows: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
#include "step.wgsl"
@group(0) @binding(2) var<storage, read> qw: array<u32>;
#ifdef FROM_IDS
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
#else
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
#endif

const EMBED_WG: u32 = 64u;

fn put(i: u32, v: f32) {
#ifdef ACCUMULATE
    // The sum must be one rounding of out + (the exact value). Compilers that treat float
    // arithmetic as reassociable (Mesa's NIR does for ops not marked exact, and WGSL cannot mark
    // them) may merge this add into the multiply-add that computed the value, which rounds
    // differently (seen on lavapipe: Q4_K sums 1 ulp off). Passing the value through an
    // integer XOR with a zero the compiler cannot see keeps the two apart.
    let exact = bitcast<f32>(bitcast<u32>(v * params.scale) ^ params.zero);
    out[i] = out[i] + exact;
#else
    out[i] = v * params.scale;
#endif
}

@compute @workgroup_size(EMBED_WG)
fn embed(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let t = wid.y;
    let dim = params.dim;
    let part = wid.x * EMBED_WG + lid;
    if t >= min(step_params.n_tokens, params.max_tokens) || part >= q_parts(dim) {
        return;
    }
#ifdef FROM_IDS
    let id = min(ids[t], params.rows - 1u);
#else
#ifdef FIRST_ROW
    let id = 0u;
#else
    let id = min(token_pos(t), params.rows - 1u);
#endif
#endif
    if id < params.first_row || id - params.first_row >= params.part_rows {
        return;
    }
    let v = q_dequant(q_load(id - params.first_row, part, dim));
    let c0 = 8u * part;
    let base = t * dim + c0;
    for (var i = 0u; i < 4u; i++) {
        if c0 + i < dim {
            put(base + i, v.lo[i]);
        }
        if c0 + 4u + i < dim {
            put(base + 4u + i, v.hi[i]);
        }
    }
}
