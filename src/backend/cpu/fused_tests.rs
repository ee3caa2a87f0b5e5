//! The fused rows against the unpacked path and the one-token reference.

use super::*;
use crate::backend::cpu::quant::{Q8Rows, UnpackedRow};
use crate::backend::cpu::test_rng::Lcg;

/// Random blocks of `dtype` with finite f16 scales and offsets of either sign.
pub(crate) fn random_row(rng: &mut Lcg, dtype: DType, blocks: usize) -> Vec<u8> {
    let l = layout(dtype).unwrap();
    let mut out = Vec::with_capacity(blocks * l.size);
    for _ in 0..blocks {
        let mut b: Vec<u8> = (0..l.size).map(|_| rng.next() as u8).collect();
        b[0..2].copy_from_slice(&half::f16::from_f32(rng.f32() * 0.05).to_le_bytes());
        if l.offset {
            b[2..4].copy_from_slice(&half::f16::from_f32(rng.f32() * 0.1).to_le_bytes());
        }
        out.extend(b);
    }
    out
}

/// The fused row dot equals unpacking and the common dot bit for bit, for every
/// 32-value type and odd and even block counts (a pair loop and a last block).
#[test]
fn fused_rows_match_the_unpacked_path_bit_for_bit() {
    let mut rng = Lcg(0x5eed);
    for dtype in [
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
    ] {
        if !available(dtype) {
            eprintln!("no fused path for {} on this CPU", dtype.name());
            continue;
        }
        for blocks in [1usize, 2, 3, 7, 18, 33] {
            let cols = blocks * QK;
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
                "{} × {blocks} blocks: {got} vs {want}",
                dtype.name()
            );
        }
    }
}

/// Several tokens through one pass over the row give each token's one-token bits, for
/// token counts around the group of four and odd and even block counts; on a CPU with
/// AVX-512 VNNI the pass is the VNNI path and the one-token reference the AVX2 one, so the
/// two paths' bits are held equal here.
#[test]
fn rows_for_several_tokens_match_one_token_at_a_time() {
    let mut rng = Lcg(0xba7c4);
    for dtype in [
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
    ] {
        if !available(dtype) {
            continue;
        }
        // every count of four-pair steps and leftover pairs and blocks the VNNI path meets
        for blocks in [1usize, 2, 5, 8, 9, 16, 17, 18, 23, 64, 71] {
            let cols = blocks * QK;
            let row = random_row(&mut rng, dtype, blocks);
            for tokens in [1usize, 2, 3, 4, 5, 7, 8, 9] {
                let x: Vec<f32> = (0..tokens * cols).map(|_| rng.f32() * 3.0).collect();
                let mut q8 = Q8Rows::default();
                q8.quantize(&x, cols);
                let mut got = vec![f32::NAN; tokens];
                assert!(row_dot_tokens(dtype, &row, &q8, &mut got, &mut Vec::new()));
                for (t, got) in got.iter().enumerate() {
                    let (q, d, s) = q8.row(t);
                    let want = row_dot(dtype, &row, q, d, s, &mut Vec::new()).unwrap();
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{} × {blocks} blocks, token {t} of {tokens}: {got} vs {want}",
                        dtype.name()
                    );
                }
            }
        }
    }
}

/// Other types are left to the unpacked path (the K-quants' own fused path is tested in
/// `fused_k`).
#[test]
fn other_types_decline() {
    let mut offsets = Vec::new();
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        assert!(!available(dtype));
        assert_eq!(row_dot(dtype, &[], &[], &[], &[], &mut offsets), None);
        let q8 = Q8Rows::default();
        assert!(!row_dot_tokens(dtype, &[], &q8, &mut [], &mut offsets));
    }
}
