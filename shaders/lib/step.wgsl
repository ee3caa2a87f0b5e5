// The step uniform every token-dependent kernel binds at @binding(1): the Rust
// `StepParams`, written once per forward step (the position of its first token, its token
// count, and the cached positions attention reads after it).

struct Step {
    pos0: u32,
    n_tokens: u32,
    kv_len: u32,
    _pad: u32,
}

@group(0) @binding(1) var<uniform> step_params: Step;
