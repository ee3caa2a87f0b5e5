// The second half of split attention (flash-decoding): combines the partials that the SPLIT
// forms of attention.wgsl / attention_rows.wgsl wrote per (token, head, split) into the
// attention output:
//   M = max_s m_s,  out[t, h, d] = sum_s exp(m_s - M) acc_s[d] / sum_s exp(m_s - M) l_s
// over the splits that hold keys of token t (splits 0..ceil(keys/keys_per_split) of the keys it reads).
// One invocation per output value, no barriers; grid (ceil(n_heads * hd / MWG_SIZE), n_tokens).
// split_part: see attention_common.wgsl; out: [max_tokens, n_heads * hd].
#include "attention_common.wgsl"

@group(0) @binding(2) var<storage, read> split_part: array<f32>;
@group(0) @binding(3) var<storage, read_write> attn_out: array<OutElem>;

@compute @workgroup_size(MWG_SIZE)
fn attention_merge(@builtin(global_invocation_id) gid: vec3<u32>) {
    let hd = params.head_dim;
    let i = gid.x;
    let t = gid.y;
    if i >= params.n_heads * hd || t >= step_params.n_tokens {
        return;
    }
    let h = i / hd;
    let d = i % hd;
    let n_splits = min(
        (token_keys(t) - token_first_key(t) + params.keys_per_split - 1u) / params.keys_per_split,
        params.max_splits,
    );
    var m = NEG_BIG;
    for (var s = 0u; s < n_splits; s++) {
        m = max(m, split_part[partial_index(t, h, s) + hd]);
    }
    var num = 0.0;
    var den = 0.0;
    for (var s = 0u; s < n_splits; s++) {
        let r = partial_index(t, h, s);
        let w = exp(split_part[r + hd] - m);
        num += w * split_part[r + d];
        den += w * split_part[r + hd + 1u];
    }
    attn_out[t * params.n_heads * hd + i] = out_value(num * (1.0 / den));
}
