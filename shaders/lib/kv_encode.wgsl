// Encoding one 32-value block of a cached K or V row in its kind (kv_kind.wgsl has the layout;
// src/dtype/kv.rs is the CPU reference the result is bit-exact with). Shared by the KV store
// (kv_store.wgsl) and the stacked Q/K/V projection that encodes its own rows (linear_io.wgsl,
// KV_BLOCKS). The includer includes kv_kind.wgsl first and defines
//   fn kv_src(which: u32, t: u32, c: u32) -> f32   value c of token t's K (0) or V (1) row,
//                                                 0 past the row
//   fn kv_put(which: u32, i: u32, w: u32)          writes word i of that cache

// GGUF-style rounding: half away from zero.
fn round_away(v: f32) -> f32 {
    return sign(v) * floor(abs(v) + 0.5);
}

// The NF4 code of v in [-1, 1]: the nearest level, the lower on a tie.
fn nf4_code(v: f32) -> u32 {
    var code = 0u;
    for (var i = 0u; i < 15u; i++) {
        if v > (nf4_levels[i] + nf4_levels[i + 1u]) * 0.5 {
            code = i + 1u;
        }
    }
    return code;
}

// Encodes block b of token t's row of `dim` values into the row at word `base` (`sw` scale
// words first); returns the block's scale (0 for kinds without scales), which the caller
// stores: two blocks share a scale word.
fn encode_block(which: u32, kind: u32, t: u32, b: u32, base: u32, sw: u32, dim: u32) -> f32 {
    let c0 = b * 32u;
    if kind == KV_F32 {
        for (var i = 0u; i < 32u; i++) {
            let c = c0 + i;
            if c < dim {
                kv_put(which, base + c, bitcast<u32>(kv_src(which, t, c)));
            }
        }
        return 0.0;
    }
    if kind == KV_F16 {
        for (var i = 0u; i < 32u; i += 2u) {
            let c = c0 + i;
            if c < dim {
                let pair = vec2<f32>(kv_src(which, t, c), kv_src(which, t, c + 1u));
                kv_put(which, base + c / 2u, pack2x16float(clamp(pair, vec2<f32>(-65504.0),
                    vec2<f32>(65504.0))));
            }
        }
        return 0.0;
    }
    var amax = 0.0;
    var max_v = 0.0;
    for (var i = 0u; i < 32u; i++) {
        let v = kv_src(which, t, c0 + i);
        if abs(v) > amax {
            amax = abs(v);
            max_v = v;
        }
    }
    var d = amax;
    if kind == KV_Q8_0 {
        d = amax / 127.0;
    } else if kind == KV_Q4_0 {
        d = max_v / -8.0;
    }
    let id = select(0.0, 1.0 / d, d != 0.0);
    if kind == KV_Q8_0 {
        for (var w = 0u; w < 8u; w++) {
            var word = 0u;
            for (var k = 0u; k < 4u; k++) {
                let q = clamp(round_away(kv_src(which, t, c0 + 4u * w + k) * id), -127.0, 127.0);
                word |= (bitcast<u32>(i32(q)) & 0xffu) << (8u * k);
            }
            kv_put(which, base + sw + b * 8u + w, word);
        }
        return d;
    }
    for (var w = 0u; w < 4u; w++) {
        var word = 0u;
        for (var k = 0u; k < 8u; k++) {
            let v = kv_src(which, t, c0 + 8u * w + k) * id;
            var code: u32;
            if kind == KV_Q4_0 {
                code = min(u32(max(v + 8.5, 0.0)), 15u);
            } else {
                code = nf4_code(v);
            }
            word |= code << (4u * k);
        }
        kv_put(which, base + sw + b * 4u + w, word);
    }
    return d;
}
