// The step uniform every token-dependent kernel binds at @binding(1): the Rust
// `StepParams` and `StepRow`s, written once per forward step.
//
// A step's tokens are either one run of one sequence (batched == 0: token t at position
// pos0 + t, its cache rows starting at rows[0].y, its KV slot rows[0].z) or one token from each
// of several sequences (batched != 0: token t at position rows[t].x, its sequence's cache rows
// starting at rows[t].y, its slot rows[t].z). A sequence's position p lives in cache row
// base + p, or in a local layer's ring of R rows in row slot * R + p % R (cache_row).

// Tokens a batched step holds at most (`STEP_ROWS` in src/gpu/ops.rs).
const STEP_ROWS: u32 = 64u;

struct Step {
    pos0: u32,
    n_tokens: u32,
    // Cached positions attention reads after this step's keys are written (the most of any
    // sequence of a batched step).
    kv_len: u32,
    batched: u32,
    // (position, first cache row of the sequence, its slot, 0) per token
    rows: array<vec4<u32>, STEP_ROWS>,
}

@group(0) @binding(1) var<uniform> step_params: Step;

// Position of the step's token t in its sequence.
fn token_pos(t: u32) -> u32 {
    if step_params.batched != 0u {
        return step_params.rows[min(t, STEP_ROWS - 1u)].x;
    }
    return step_params.pos0 + t;
}

// First cache row of token t's sequence.
fn token_base(t: u32) -> u32 {
    if step_params.batched != 0u {
        return step_params.rows[min(t, STEP_ROWS - 1u)].y;
    }
    return step_params.rows[0].y;
}

// KV slot of token t's sequence.
fn token_slot(t: u32) -> u32 {
    if step_params.batched != 0u {
        return step_params.rows[min(t, STEP_ROWS - 1u)].z;
    }
    return step_params.rows[0].z;
}

// The cache row of position p of token t's sequence in a layer whose ring holds `ring` rows
// per sequence (0: the layer keeps every position).
fn cache_row(t: u32, p: u32, ring: u32) -> u32 {
    if ring == 0u {
        return token_base(t) + p;
    }
    return token_slot(t) * ring + p % ring;
}
