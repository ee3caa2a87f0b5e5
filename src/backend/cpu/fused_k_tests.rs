//! The K-quant fused rows against the unpacked path, bit for bit.

use super::*;
use crate::backend::cpu::quant::{Q8Rows, UnpackedRow};
use crate::backend::cpu::test_rng::Lcg;

/// The word-at-a-time scales and mins equal the byte-by-byte definition (GGML's
/// `get_scale_min_k4`) on random scale bytes.
#[test]
fn scales_and_mins_by_words_match_the_definition() {
    let mut rng = Lcg(0x6b5c);
    for _ in 0..20_000 {
        let s: Vec<u8> = (0..12).map(|_| rng.next() as u8).collect();
        let mut want = ([0u8; 8], [0u8; 8]);
        for j in 0..8 {
            (want.0[j], want.1[j]) = if j < 4 {
                (s[j] & 63, s[j + 4] & 63)
            } else {
                (
                    (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
                    (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
                )
            };
        }
        assert_eq!(k_scales_and_mins(&s), want, "{s:?}");
    }
}

fn f16_bytes(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_le_bytes()
}

/// Random super-blocks of `dtype` (every scale, min and value byte random) with finite f16
/// super-scales of either sign.
pub(crate) fn random_row(rng: &mut Lcg, dtype: DType, blocks: usize) -> Vec<u8> {
    let size = block_size(dtype).unwrap();
    let mut out = Vec::with_capacity(blocks * size);
    for _ in 0..blocks {
        let mut b: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
        match dtype {
            DType::Q6_K => b[208..210].copy_from_slice(&f16_bytes(rng.f32() * 0.01)),
            _ => {
                b[0..2].copy_from_slice(&f16_bytes(rng.f32() * 0.01));
                b[2..4].copy_from_slice(&f16_bytes(rng.f32() * 0.02));
            }
        }
        out.extend(b);
    }
    out
}

const K_TYPES: [DType; 3] = [DType::Q4_K, DType::Q5_K, DType::Q6_K];

/// The fused dot equals unpacking and the common dot bit for bit, for every K-quant and
/// rows of one to five super-blocks.
#[test]
fn k_rows_match_the_unpacked_path_bit_for_bit() {
    let mut rng = Lcg(0x6b5eed);
    for dtype in K_TYPES {
        if !available(dtype) {
            eprintln!("no fused path for {} on this CPU", dtype.name());
            continue;
        }
        for blocks in [1usize, 2, 3, 5] {
            for _ in 0..4 {
                let cols = blocks * QK_K;
                let row = random_row(&mut rng, dtype, blocks);
                let x: Vec<f32> = (0..cols).map(|_| rng.f32() * 3.0).collect();
                let mut q8 = Q8Rows::default();
                q8.quantize(&x, cols);
                let (q, d, s) = q8.row(0);
                let mut unpacked = UnpackedRow::with_cols(cols);
                unpacked.unpack(dtype, &row);
                let want = unpacked.dot(q, d, s);
                let got = row_dot(dtype, &row, q, d, s, &mut Vec::new()).unwrap();
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{} × {blocks} super-blocks: {got} vs {want}",
                    dtype.name()
                );
            }
        }
    }
}

/// Several tokens through one pass give each token's one-token bits.
#[test]
fn k_rows_for_several_tokens_match_one_token_at_a_time() {
    let mut rng = Lcg(0x6b7c4);
    for dtype in K_TYPES {
        if !available(dtype) {
            continue;
        }
        for blocks in [1usize, 3] {
            let cols = blocks * QK_K;
            let row = random_row(&mut rng, dtype, blocks);
            for tokens in [1usize, 2, 3, 4, 5, 9] {
                let x: Vec<f32> = (0..tokens * cols).map(|_| rng.f32() * 3.0).collect();
                let mut q8 = Q8Rows::default();
                q8.quantize(&x, cols);
                let mut got = vec![f32::NAN; tokens];
                assert!(row_dot_tokens(dtype, &row, &q8, &mut got, &mut Vec::new()));
                for (t, got) in got.iter().enumerate() {
                    let (q, d, s) = q8.row(t);
                    let mut unpacked = UnpackedRow::with_cols(cols);
                    unpacked.unpack(dtype, &row);
                    let want = unpacked.dot(q, d, s);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{} × {blocks}, token {t} of {tokens}: {got} vs {want}",
                        dtype.name()
                    );
                }
            }
        }
    }
}

/// The 32-value types and floats are not this path's.
#[test]
fn other_types_decline() {
    for dtype in [DType::Q4_0, DType::Q8_0, DType::Q5_1, DType::F32] {
        assert!(!available(dtype));
        assert_eq!(row_dot(dtype, &[], &[], &[], &[], &mut Vec::new()), None);
    }
}
