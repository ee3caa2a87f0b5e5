//! Q5_0 and Q5_1: dequantization by hand and round trips within half a step.

use super::tests::{assert_bits, f16_at_least, f16_at_most, random_blocks, seeded};
use super::*;

/// A block's 32 five-bit values as `qh` (fifth bits) and 16 nibble bytes.
fn pack5(q: &[u8; 32]) -> ([u8; 4], [u8; 16]) {
    let mut qh = 0u32;
    let mut qs = [0u8; 16];
    for j in 0..16 {
        qs[j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
        qh |= u32::from(q[j] >> 4) << j;
        qh |= u32::from(q[j + 16] >> 4) << (j + 16);
    }
    (qh.to_le_bytes(), qs)
}

#[test]
fn dequantize_q5_0_and_q5_1_by_hand() {
    // q = 0, 1, ..., 31 over the block: every fifth bit pattern and nibble appears
    let q: [u8; 32] = std::array::from_fn(|i| i as u8);
    let (qh, qs) = pack5(&q);
    let mut b = half::f16::from_f32(0.5).to_le_bytes().to_vec();
    b.extend_from_slice(&qh);
    b.extend_from_slice(&qs);
    let want: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.5).collect();
    assert_bits(&dequantize(DType::Q5_0, &b, 32, "t").unwrap(), &want);

    let mut b = half::f16::from_f32(0.25).to_le_bytes().to_vec();
    b.extend_from_slice(&half::f16::from_f32(-3.0).to_le_bytes());
    b.extend_from_slice(&qh);
    b.extend_from_slice(&qs);
    let want: Vec<f32> = (0..32).map(|i| 0.25 * i as f32 - 3.0).collect();
    assert_bits(&dequantize(DType::Q5_1, &b, 32, "t").unwrap(), &want);
    assert_eq!(DType::from_ggml(6), Some(DType::Q5_0));
    assert_eq!(DType::from_ggml(7), Some(DType::Q5_1));
    assert_eq!(
        (DType::Q5_0.block_bytes(), DType::Q5_1.block_bytes()),
        (22, 24)
    );
}

#[test]
fn q5_round_trips_within_half_a_step_and_beat_4_bits() {
    let mut rng = seeded("q5_round_trips_within_half_a_step", 0x0550);
    let x = random_blocks(&mut rng, 1000, true);
    // Q5_0: d the smallest f16 with 15 d >= max |x| (q - 16 in [-16, 15])
    let (mut b0, mut d0) = (Vec::new(), Vec::new());
    // Q5_1: m the largest f16 <= min, d the smallest f16 with m + 31 d >= max
    let (mut b1, mut d1) = (Vec::new(), Vec::new());
    for block in x.chunks_exact(32) {
        let amax = block.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let mut d = f16_at_least(amax / 15.0).to_f32();
        while 15.0 * d < amax {
            d = f16_at_least(d * (1.0 + 1e-3)).to_f32();
        }
        let q: [u8; 32] = std::array::from_fn(|i| {
            let v = if d == 0.0 {
                0.0
            } else {
                (block[i] / d).round()
            };
            (v as i32 + 16) as u8
        });
        let (qh, qs) = pack5(&q);
        b0.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        b0.extend_from_slice(&qh);
        b0.extend_from_slice(&qs);
        d0.push(d);

        let lo = block.iter().copied().fold(f32::INFINITY, f32::min);
        let hi = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let m = f16_at_most(lo).to_f32();
        let mut d = f16_at_least((hi - m) / 31.0).to_f32();
        while m + 31.0 * d < hi {
            d = f16_at_least(d * (1.0 + 1e-3)).to_f32();
        }
        let q: [u8; 32] = std::array::from_fn(|i| {
            if d == 0.0 {
                0
            } else {
                ((block[i] - m) / d).round() as u8
            }
        });
        let (qh, qs) = pack5(&q);
        b1.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        b1.extend_from_slice(&half::f16::from_f32(m).to_le_bytes());
        b1.extend_from_slice(&qh);
        b1.extend_from_slice(&qs);
        d1.push(d);
    }
    let n = x.len() as u64;
    let y0 = dequantize(DType::Q5_0, &b0, n, "t").unwrap();
    let y1 = dequantize(DType::Q5_1, &b1, n, "t").unwrap();
    for (i, &v) in x.iter().enumerate() {
        let tol0 = d0[i / 32] * (0.5 + 1e-5);
        assert!(
            (v - y0[i]).abs() <= tol0,
            "Q5_0 value {i}: {v} -> {}",
            y0[i]
        );
        let tol1 = d1[i / 32] * (0.5 + 1e-5) + f32::EPSILON * y1[i].abs();
        assert!(
            (v - y1[i]).abs() <= tol1,
            "Q5_1 value {i}: {v} -> {}",
            y1[i]
        );
    }
    // relative RMSE against f32: a fifth bit halves the step of 4-bit formats
    let rel = |y: &[f32]| {
        let err: f64 = x.iter().zip(y).map(|(a, b)| f64::from(a - b).powi(2)).sum();
        let norm: f64 = x.iter().map(|a| f64::from(*a).powi(2)).sum();
        (err / norm).sqrt()
    };
    let (r0, r1) = (rel(&y0), rel(&y1));
    assert!(r0 < 0.04 && r1 < 0.04, "relative RMSE Q5_0 {r0}, Q5_1 {r1}");
}
