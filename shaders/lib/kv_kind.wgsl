// KV-cache kinds (src/dtype/kv.rs has the layout and the CPU reference): a cached row of
// kv_dim values is a run of u32 words, the block scales first (two f16 per word, block b in
// half b % 2 of word b / 2), then the values. Blocks hold 32 values.
//   f32: a value per word; f16: two per word (pack2x16float); q8_0: four i8 per word, x = d q;
//   q4_0: eight 4-bit codes per word, x = d (q - 8); nf4: eight 4-bit codes, x = d NF4[q].
// The includer defines K_KIND and V_KIND (codes below) and `fn kv_word(which, i) -> u32`,
// word i of the K (which = 0) or V (which = 1) cache.

const KV_F32: u32 = 0u;
const KV_F16: u32 = 1u;
const KV_Q8_0: u32 = 2u;
const KV_Q4_0: u32 = 3u;
const KV_NF4: u32 = 4u;

// The 4-bit normal-float levels (dtype::kv::NF4_LEVELS).
var<private> nf4_levels: array<f32, 16> = array<f32, 16>(
    -1.0, -0.6961928, -0.52507305, -0.3949175, -0.28444138, -0.18477343, -0.091050036, 0.0,
    0.0795803, 0.1609302, 0.2461123, 0.33791524, 0.44070983, 0.562617, 0.72295684, 1.0);

// The kind of the K (0) or V (1) cache.
fn kv_kind(which: u32) -> u32 {
    return select(K_KIND, V_KIND, which == 1u);
}

// Words of block scales at the start of a row.
fn kv_scale_words(kind: u32, kv_dim: u32) -> u32 {
    if kind >= KV_Q8_0 {
        return ((kv_dim + 31u) / 32u + 1u) / 2u;
    }
    return 0u;
}

// Words of one row.
fn kv_row_words(kind: u32, kv_dim: u32) -> u32 {
    let blocks = (kv_dim + 31u) / 32u;
    switch kind {
        case 0u: { return kv_dim; }
        case 1u: { return (kv_dim + 1u) / 2u; }
        case 2u: { return kv_scale_words(kind, kv_dim) + blocks * 8u; }
        default: { return kv_scale_words(kind, kv_dim) + blocks * 4u; }
    }
}

// Scale of the block holding value e of the row starting at word `base`.
fn kv_block_scale(which: u32, base: u32, e: u32) -> f32 {
    let b = e / 32u;
    return unpack2x16float(kv_word(which, base + b / 2u))[b % 2u];
}

// Values e .. e + 3 (e a multiple of 4) of the row at word `base` with `sw` scale words.
fn kv_load4(which: u32, base: u32, sw: u32, e: u32) -> vec4<f32> {
    let kind = kv_kind(which);
    if kind == KV_F32 {
        let w = base + e;
        return vec4<f32>(bitcast<f32>(kv_word(which, w)), bitcast<f32>(kv_word(which, w + 1u)),
            bitcast<f32>(kv_word(which, w + 2u)), bitcast<f32>(kv_word(which, w + 3u)));
    }
    if kind == KV_F16 {
        let w = base + e / 2u;
        return vec4<f32>(unpack2x16float(kv_word(which, w)), unpack2x16float(kv_word(which, w + 1u)));
    }
    let d = kv_block_scale(which, base, e);
    if kind == KV_Q8_0 {
        let w = kv_word(which, base + sw + e / 4u);
        let q = vec4<i32>(bitcast<i32>(w << 24u), bitcast<i32>(w << 16u), bitcast<i32>(w << 8u),
            bitcast<i32>(w)) >> vec4<u32>(24u);
        return vec4<f32>(q) * d;
    }
    let w = kv_word(which, base + sw + e / 8u) >> ((e % 8u) * 4u);
    let n = (vec4<u32>(w) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u);
    if kind == KV_Q4_0 {
        return (vec4<f32>(n) - 8.0) * d;
    }
    return vec4<f32>(nf4_levels[n.x], nf4_levels[n.y], nf4_levels[n.z], nf4_levels[n.w]) * d;
}

// Value e of the row at word `base` with `sw` scale words.
fn kv_load1(which: u32, base: u32, sw: u32, e: u32) -> f32 {
    let kind = kv_kind(which);
    if kind == KV_F32 {
        return bitcast<f32>(kv_word(which, base + e));
    }
    if kind == KV_F16 {
        return unpack2x16float(kv_word(which, base + e / 2u))[e % 2u];
    }
    let d = kv_block_scale(which, base, e);
    if kind == KV_Q8_0 {
        let w = kv_word(which, base + sw + e / 4u);
        return f32(bitcast<i32>(w << (24u - 8u * (e % 4u))) >> 24u) * d;
    }
    let n = (kv_word(which, base + sw + e / 8u) >> ((e % 8u) * 4u)) & 15u;
    if kind == KV_Q4_0 {
        return (f32(n) - 8.0) * d;
    }
    return nf4_levels[n] * d;
}
