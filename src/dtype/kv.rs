//! KV-cache kinds: how one cached row of K or V (`kv_dim` values of one position and layer)
//! is stored, and the CPU encoder and decoder that are the reference the GPU's
//! `shaders/kv_store.wgsl` (write) and `shaders/lib/kv_kind.wgsl` (read) are checked against.
//!
//! A row is a run of u32 words: first the block scales (two f16 per word, block `b` in half
//! `b % 2` of word `b / 2`), then the values. Blocks hold 32 values; a row whose `kv_dim` is
//! not a multiple of 32 is padded with zeros to whole blocks.
//!
//! | kind | values | scale per block | bytes per 32 values |
//! |---|---|---|---|
//! | `f32` | one per word | none | 128 |
//! | `f16` | two per word (`pack2x16float`) | none | 64 |
//! | `q8_0` | i8, four per word; `x = d·q` | `d = absmax / 127` | 34 |
//! | `q4_0` | 4-bit, eight per word; `x = d·(q − 8)` | `d = −max / 8` (signed) | 18 |
//! | `nf4` | 4-bit codes of the normal-float table; `x = d·NF4[q]` | `d = absmax` | 18 |
//!
//! Encoding follows GGUF's Q8_0 and Q4_0 arithmetic (scale from the block's extreme, codes
//! from the unrounded inverse scale, the scale stored as f16); NF4 codes are the table entry
//! nearest to `x / absmax`.

use crate::error::{Error, Result};

/// Values per quantization block.
pub const KV_BLOCK: usize = 32;

/// The 16 levels of 4-bit normal-float, ascending (quantiles of a standard normal scaled to
/// [-1, 1], with an exact zero).
pub const NF4_LEVELS: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_05,
    -0.394_917_5,
    -0.284_441_38,
    -0.184_773_43,
    -0.091_050_036,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_24,
    0.440_709_83,
    0.562_617,
    0.722_956_84,
    1.0,
];

/// How K or V rows are stored in the cache.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum KvKind {
    /// IEEE binary32: exact.
    #[default]
    F32,
    /// IEEE binary16, round to nearest even (values beyond ±65504 saturate).
    F16,
    /// 8-bit blocks of 32 with an f16 scale.
    Q8_0,
    /// 4-bit blocks of 32 with an f16 scale.
    Q4_0,
    /// 4-bit normal-float blocks of 32 with an f16 absmax scale.
    Nf4,
}

impl KvKind {
    /// Every kind, widest first.
    pub const ALL: [KvKind; 5] = [
        KvKind::F32,
        KvKind::F16,
        KvKind::Q8_0,
        KvKind::Q4_0,
        KvKind::Nf4,
    ];

    /// The name used by options and reports (`q8_0`).
    pub fn name(self) -> &'static str {
        match self {
            KvKind::F32 => "f32",
            KvKind::F16 => "f16",
            KvKind::Q8_0 => "q8_0",
            KvKind::Q4_0 => "q4_0",
            KvKind::Nf4 => "nf4",
        }
    }

    /// Parses a kind by name (case-insensitive; `fp32`, `fp16`, `q8`, `q4` accepted for `f32`, `f16`, `q8_0`, `q4_0`);
    /// `option` names the setting in the error.
    pub fn parse(option: &'static str, s: &str) -> Result<Self> {
        let lower = s.trim().to_ascii_lowercase();
        let kind = match lower.as_str() {
            "f32" | "fp32" => KvKind::F32,
            "f16" | "fp16" => KvKind::F16,
            "q8_0" | "q8" => KvKind::Q8_0,
            "q4_0" | "q4" => KvKind::Q4_0,
            "nf4" => KvKind::Nf4,
            _ => {
                return Err(Error::invalid(
                    option,
                    format!(
                        "unknown KV-cache kind '{s}' (expected one of f32, f16, q8_0, q4_0, nf4)"
                    ),
                ))
            }
        };
        Ok(kind)
    }

    /// The code the shaders switch on (`K_KIND` / `V_KIND`): the order of [`KvKind::ALL`].
    pub fn code(self) -> u32 {
        match self {
            KvKind::F32 => 0,
            KvKind::F16 => 1,
            KvKind::Q8_0 => 2,
            KvKind::Q4_0 => 3,
            KvKind::Nf4 => 4,
        }
    }

    /// Whether the kind stores per-block scales.
    pub fn has_scales(self) -> bool {
        matches!(self, KvKind::Q8_0 | KvKind::Q4_0 | KvKind::Nf4)
    }

    /// Values per u32 word of the value area.
    pub fn values_per_word(self) -> usize {
        match self {
            KvKind::F32 => 1,
            KvKind::F16 => 2,
            KvKind::Q8_0 => 4,
            KvKind::Q4_0 | KvKind::Nf4 => 8,
        }
    }

    /// Bits of one value's code in a value word, and the mask of one code.
    pub fn code_bits(self) -> (usize, u32) {
        let bits = 32 / self.values_per_word();
        let mask = match bits {
            32 => u32::MAX,
            _ => (1u32 << bits) - 1,
        };
        (bits, mask)
    }

    /// Words of block scales at the start of a row of `kv_dim` values.
    pub fn scale_words(self, kv_dim: usize) -> usize {
        if self.has_scales() {
            kv_dim.div_ceil(KV_BLOCK).div_ceil(2)
        } else {
            0
        }
    }

    /// Words of one row of `kv_dim` values (scales, then values).
    pub fn row_words(self, kv_dim: usize) -> usize {
        let values = if self.has_scales() {
            kv_dim.div_ceil(KV_BLOCK) * KV_BLOCK / self.values_per_word()
        } else {
            kv_dim.div_ceil(self.values_per_word())
        };
        self.scale_words(kv_dim) + values
    }

    /// Bytes of one row of `kv_dim` values.
    pub fn row_bytes(self, kv_dim: usize) -> u64 {
        self.row_words(kv_dim) as u64 * 4
    }

    /// Encodes one row (`values.len()` = kv_dim) into [`KvKind::row_words`] words.
    pub fn encode_row(self, values: &[f32]) -> Vec<u32> {
        let kv_dim = values.len();
        let sw = self.scale_words(kv_dim);
        let mut out = vec![0u32; self.row_words(kv_dim)];
        match self {
            KvKind::F32 => {
                for (o, &v) in out.iter_mut().zip(values) {
                    *o = v.to_bits();
                }
            }
            KvKind::F16 => {
                for (i, pair) in values.chunks(2).enumerate() {
                    let lo = f16_bits(pair[0]);
                    let hi = pair.get(1).map_or(0, |&v| f16_bits(v));
                    out[i] = u32::from(lo) | (u32::from(hi) << 16);
                }
            }
            _ => {
                for (b, block) in values.chunks(KV_BLOCK).enumerate() {
                    let mut x = [0f32; KV_BLOCK];
                    x[..block.len()].copy_from_slice(block);
                    let (d, codes) = quantize_block(self, &x);
                    out[b / 2] |= u32::from(half::f16::from_f32(d).to_bits()) << (16 * (b % 2));
                    let per = self.values_per_word();
                    let (bits, mask) = self.code_bits();
                    for (i, &c) in codes.iter().enumerate() {
                        let word = sw + (b * KV_BLOCK + i) / per;
                        out[word] |= (c & mask) << (bits * (i % per));
                    }
                }
            }
        }
        out
    }

    /// Decodes a row of `kv_dim` values from its words.
    pub fn decode_row(self, words: &[u32], kv_dim: usize) -> Vec<f32> {
        (0..kv_dim)
            .map(|e| self.decode_at(words, kv_dim, e))
            .collect()
    }

    /// Value `e` of a row of `kv_dim` values stored in `words` (0 when `words` is too short).
    pub fn decode_at(self, words: &[u32], kv_dim: usize, e: usize) -> f32 {
        let word = |i: usize| words.get(i).copied().unwrap_or(0);
        let sw = self.scale_words(kv_dim);
        let per = self.values_per_word();
        let w = word(sw + e / per);
        let scale = || {
            let b = e / KV_BLOCK;
            half::f16::from_bits((word(b / 2) >> (16 * (b % 2))) as u16).to_f32()
        };
        match self {
            KvKind::F32 => f32::from_bits(w),
            KvKind::F16 => half::f16::from_bits((w >> (16 * (e % 2))) as u16).to_f32(),
            KvKind::Q8_0 => f32::from(((w >> (8 * (e % 4))) & 0xff) as u8 as i8) * scale(),
            KvKind::Q4_0 => (((w >> (4 * (e % 8))) & 0xf) as f32 - 8.0) * scale(),
            KvKind::Nf4 => NF4_LEVELS[((w >> (4 * (e % 8))) & 0xf) as usize] * scale(),
        }
    }

    /// The largest error encoding can make on a value of a block whose largest magnitude is
    /// `absmax` (0 for f32; half an f16 ulp for f16), with room for the f16 scale's rounding.
    pub fn max_error(self, absmax: f32) -> f32 {
        let slack = 1.0 + 2.0f32.powi(-10);
        match self {
            KvKind::F32 => 0.0,
            KvKind::F16 => absmax * 2.0f32.powi(-11),
            // half a step of d = absmax / 127, plus d's rounding on the largest code
            KvKind::Q8_0 => absmax / 127.0 * 0.5 * slack + absmax * 2.0f32.powi(-11),
            // a whole step at the clipped end (-max maps to code 15, 7·d)
            KvKind::Q4_0 => absmax / 8.0 * slack + absmax * 2.0f32.powi(-11),
            // half the widest gap between levels (between -1 and the next)
            KvKind::Nf4 => {
                absmax * (NF4_LEVELS[1] - NF4_LEVELS[0]) * 0.5 * slack + absmax * 2.0f32.powi(-11)
            }
        }
    }
}

impl std::fmt::Display for KvKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// f16 bits of `v`, round to nearest even, saturating at ±65504 (as the GPU writer clamps).
fn f16_bits(v: f32) -> u16 {
    half::f16::from_f32(v.clamp(-65504.0, 65504.0)).to_bits()
}

/// GGUF-style rounding: half away from zero.
fn round_away(v: f32) -> f32 {
    v.signum() * (v.abs() + 0.5).floor()
}

/// The scale (before f16 rounding) and the codes of one block of 32 values.
fn quantize_block(kind: KvKind, x: &[f32; KV_BLOCK]) -> (f32, [u32; KV_BLOCK]) {
    let mut codes = [0u32; KV_BLOCK];
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let inv = |d: f32| if d != 0.0 { 1.0 / d } else { 0.0 };
    match kind {
        KvKind::Q8_0 => {
            let d = amax / 127.0;
            let id = inv(d);
            for (c, &v) in codes.iter_mut().zip(x) {
                *c = round_away(v * id).clamp(-127.0, 127.0) as i32 as u32;
            }
            (d, codes)
        }
        KvKind::Q4_0 => {
            let d = max / -8.0;
            let id = inv(d);
            for (c, &v) in codes.iter_mut().zip(x) {
                *c = ((v * id + 8.5).max(0.0) as u32).min(15);
            }
            (d, codes)
        }
        _ => {
            let d = amax;
            let id = inv(d);
            for (c, &v) in codes.iter_mut().zip(x) {
                *c = nf4_code(v * id);
            }
            (d, codes)
        }
    }
}

/// The NF4 code of `v` (in [-1, 1]): the nearest level, the lower one on a tie.
pub fn nf4_code(v: f32) -> u32 {
    let mut code = 0u32;
    for i in 0..15 {
        let mid = (NF4_LEVELS[i] + NF4_LEVELS[i + 1]) * 0.5;
        if v > mid {
            code = i as u32 + 1;
        }
    }
    code
}

/// The kinds of the K and the V cache (they may differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KvKinds {
    /// Kind of the K cache.
    pub k: KvKind,
    /// Kind of the V cache.
    pub v: KvKind,
}

impl KvKinds {
    /// Both caches in `kind`.
    pub fn both(kind: KvKind) -> Self {
        Self { k: kind, v: kind }
    }

    /// Both f32 (the exact cache).
    pub fn is_f32(self) -> bool {
        self.k == KvKind::F32 && self.v == KvKind::F32
    }

    /// Whether both K and V are f16 (written two values per word by their producer).
    pub fn is_f16(self) -> bool {
        self.k == KvKind::F16 && self.v == KvKind::F16
    }

    /// Bytes of one position's K and V rows in one layer.
    pub fn row_bytes(self, kv_dim: usize) -> u64 {
        self.k.row_bytes(kv_dim) + self.v.row_bytes(kv_dim)
    }

    /// Bytes per cached token over `layers` layers.
    pub fn bytes_per_token(self, layers: usize, kv_dim: usize) -> u64 {
        self.row_bytes(kv_dim).saturating_mul(layers as u64)
    }
    /// Resolves the options `kv_cache` (both) and `k_cache` / `v_cache` (one each, taking
    /// precedence); unset means f32.
    pub fn from_options(
        kv_cache: Option<&str>,
        k_cache: Option<&str>,
        v_cache: Option<&str>,
    ) -> Result<Self> {
        let both = kv_cache
            .map(|s| KvKind::parse("kv_cache", s))
            .transpose()?
            .unwrap_or_default();
        let k = k_cache
            .map(|s| KvKind::parse("k_cache", s))
            .transpose()?
            .unwrap_or(both);
        let v = v_cache
            .map(|s| KvKind::parse("v_cache", s))
            .transpose()?
            .unwrap_or(both);
        Ok(Self { k, v })
    }
}

impl std::fmt::Display for KvKinds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.k == self.v {
            write!(f, "{}", self.k)
        } else {
            write!(f, "k {} / v {}", self.k, self.v)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: usize, seed: u32) -> Vec<f32> {
        // a small deterministic spread with outliers, no rand dependency in the leaf
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let u = (s as f32 / u32::MAX as f32) * 2.0 - 1.0;
                if i % 29 == 7 {
                    u * 9.0
                } else {
                    u
                }
            })
            .collect()
    }

    #[test]
    fn sizes_per_kind() {
        // SmolLM2: 3 KV heads of 64
        let kv = 192;
        assert_eq!(KvKind::F32.row_bytes(kv), 768);
        assert_eq!(KvKind::F16.row_bytes(kv), 384);
        assert_eq!(KvKind::Q8_0.row_bytes(kv), 6 * 34);
        assert_eq!(KvKind::Q4_0.row_bytes(kv), 6 * 18);
        assert_eq!(KvKind::Nf4.row_bytes(kv), 6 * 18);
        // ragged rows pad to whole blocks and words
        assert_eq!(KvKind::F16.row_words(7), 4);
        assert_eq!(KvKind::Q8_0.row_words(33), 1 + 16);
        assert_eq!(KvKind::Q4_0.row_words(70), 2 + 12);
    }

    #[test]
    fn round_trips_within_the_format_error() {
        for kind in KvKind::ALL {
            for n in [1usize, 7, 32, 33, 70, 192] {
                let x = sample(n, n as u32 + kind.code());
                let words = kind.encode_row(&x);
                assert_eq!(words.len(), kind.row_words(n));
                let y = kind.decode_row(&words, n);
                for (b, (xb, yb)) in x.chunks(KV_BLOCK).zip(y.chunks(KV_BLOCK)).enumerate() {
                    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let tol = kind.max_error(amax);
                    for (i, (a, b2)) in xb.iter().zip(yb).enumerate() {
                        assert!(
                            (a - b2).abs() <= tol,
                            "{kind} n={n} block {b} value {i}: {a} -> {b2} (tol {tol})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn exact_kinds_and_edges() {
        let x = [0.0f32, -0.0, 1.5, -2.25, 65504.0, 1e-8];
        assert_eq!(KvKind::F32.decode_row(&KvKind::F32.encode_row(&x), 6), x);
        let h = KvKind::F16.decode_row(&KvKind::F16.encode_row(&x), 6);
        assert_eq!(&h[..5], &x[..5]);
        // an all-zero block has scale 0 and decodes to zeros in every kind
        for kind in KvKind::ALL {
            let z = kind.decode_row(&kind.encode_row(&[0.0; 40]), 40);
            assert!(z.iter().all(|&v| v == 0.0), "{kind}");
        }
        // a block's extreme is exact in nf4 (its scale is the extreme) and within the f16
        // scale's rounding in q8_0
        let mut b = [0.1f32; 32];
        b[3] = -4.0;
        assert_eq!(
            KvKind::Nf4.decode_row(&KvKind::Nf4.encode_row(&b), 32)[3],
            -4.0
        );
        let y = KvKind::Q8_0.decode_row(&KvKind::Q8_0.encode_row(&b), 32);
        assert!((y[3] + 4.0).abs() <= 4.0 * 2.0f32.powi(-11), "{}", y[3]);
        assert_eq!(nf4_code(-1.0), 0);
        assert_eq!(nf4_code(1.0), 15);
        assert_eq!(nf4_code(0.0), 7);
    }

    #[test]
    fn parses_by_name_and_names_the_option() {
        assert_eq!(KvKind::parse("kv_cache", "Q8_0").unwrap(), KvKind::Q8_0);
        assert_eq!(KvKind::parse("kv_cache", "q4").unwrap(), KvKind::Q4_0);
        let e = KvKind::parse("k_cache", "int3").unwrap_err().to_string();
        assert!(e.contains("k_cache") && e.contains("int3"), "{e}");
        let kinds = KvKinds::from_options(Some("q8_0"), None, Some("f16")).unwrap();
        assert_eq!((kinds.k, kinds.v), (KvKind::Q8_0, KvKind::F16));
        assert_eq!(kinds.to_string(), "k q8_0 / v f16");
        assert!(KvKinds::from_options(None, None, None).unwrap().is_f32());
    }
}
