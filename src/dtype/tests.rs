use super::*;

#[test]
fn ggml_ids_round_trip() {
    for t in DType::ALL {
        assert_eq!(DType::from_ggml(t.ggml_id()), Some(t));
    }
    // Q8_1 (9) is a type ggml uses for activations only
    assert_eq!(DType::from_ggml(9), None);
    assert_eq!(ggml_type_name(9), "Q8_1");
}

#[test]
fn byte_sizes_follow_blocks() {
    assert_eq!(DType::Q4_K.bytes_for(512, "t").unwrap(), 288);
    assert_eq!(DType::F16.bytes_for(3, "t").unwrap(), 6);
    let err = DType::Q8_0
        .bytes_for(33, "blk.0.ffn_up.weight")
        .unwrap_err();
    assert!(err.to_string().contains("blk.0.ffn_up.weight"), "{err}");
    assert!(DType::F32.bytes_for(u64::MAX, "t").is_err());
}

// --- Dequantization: hand-built blocks ------------------------------------------------------
// f16 constants used below: 0x3C00 = 1.0, 0x3800 = 0.5, 0x3400 = 0.25, 0xBC00 = -1.0,
// 0xC000 = -2.0 (checked in `f16_constants`).

/// Compares bit patterns, so that -0.0 vs 0.0 or a last-bit difference fails.
#[track_caller]
pub(super) fn assert_bits(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "value {i}: got {g:e}, want {w:e}");
    }
}

fn le16(bits: u16) -> [u8; 2] {
    bits.to_le_bytes()
}

#[test]
fn f16_constants() {
    for (bits, v) in [
        (0x3C00, 1.0),
        (0x3800, 0.5),
        (0x3400, 0.25),
        (0xBC00, -1.0),
        (0xC000, -2.0),
    ] {
        assert_eq!(half::f16::from_bits(bits).to_f32(), v);
    }
}

#[test]
fn dequantize_f32_f16_bf16_by_hand() {
    // F32 1.5 = 0x3FC0_0000, -2.0 = 0xC000_0000, little-endian.
    let bytes = [0x00, 0x00, 0xC0, 0x3F, 0x00, 0x00, 0x00, 0xC0];
    assert_bits(
        &dequantize(DType::F32, &bytes, 2, "t").unwrap(),
        &[1.5, -2.0],
    );

    // F16: 0x3C00 = 1.0; 0xC000 = -2.0; 0x0001 = smallest subnormal 2^-24 (exact in f32);
    // 0x7C00 = +inf; 0x8000 = -0.0.
    let bytes = [0x00, 0x3C, 0x00, 0xC0, 0x01, 0x00, 0x00, 0x7C, 0x00, 0x80];
    let want = [1.0, -2.0, 2f32.powi(-24), f32::INFINITY, -0.0];
    assert_bits(&dequantize(DType::F16, &bytes, 5, "t").unwrap(), &want);

    // BF16 is the top half of an f32: 0x3F80 -> 0x3F80_0000 = 1.0; 0xC040 -> -3.0;
    // 0x0001 -> f32 bits 0x0001_0000 (a subnormal); the signalling NaN 0x7F81 -> bits
    // 0x7F81_0000 unchanged (a plain shift, as ggml does; no quiet bit added).
    let bytes = [0x80, 0x3F, 0x40, 0xC0, 0x01, 0x00, 0x81, 0x7F];
    let got = dequantize(DType::BF16, &bytes, 4, "t").unwrap();
    let want = [
        1.0,
        -3.0,
        f32::from_bits(0x0001_0000),
        f32::from_bits(0x7F81_0000),
    ];
    assert_bits(&got, &want);
}

#[test]
fn dequantize_q8_0_by_hand() {
    // [0..2] d = 0.5 (0x3800) | [2..34] qs: i8, y = q * d.
    let mut b = vec![0u8; 34];
    b[..2].copy_from_slice(&le16(0x3800));
    b[2] = 3; //     3 * 0.5 = 1.5
    b[3] = 0xFF; //  -1 * 0.5 = -0.5
    b[4] = 0x80; // -128 * 0.5 = -64
    b[33] = 0x7F; // 127 * 0.5 = 63.5
    let mut want = [0.0f32; 32]; // q = 0 -> 0 * 0.5 = +0.0
    want[0] = 1.5;
    want[1] = -0.5;
    want[2] = -64.0;
    want[31] = 63.5;
    assert_bits(&dequantize(DType::Q8_0, &b, 32, "t").unwrap(), &want);
}

#[test]
fn dequantize_q4_0_by_hand() {
    // Two blocks. [0..2] d | [2..18] qs; byte j: low nibble -> value j, high -> j + 16.
    let mut b = vec![0x88u8; 36]; // q = 8 -> (8 - 8) * d = 0
                                  // Block 0: d = 0.5 (0x3800).
    b[..2].copy_from_slice(&le16(0x3800));
    b[2] = 0xF3; // value 0: (3 - 8) * 0.5 = -2.5;  value 16: (15 - 8) * 0.5 = 3.5
    b[3] = 0x80; // value 1: (0 - 8) * 0.5 = -4.0;  value 17: (8 - 8) * 0.5 = 0
    b[17] = 0x9A; // value 15: (10 - 8) * 0.5 = 1.0; value 31: (9 - 8) * 0.5 = 0.5
                  // Block 1: d = -2.0 (0xC000), every byte 0x1F:
                  // low (15 - 8) * -2 = -14, high (1 - 8) * -2 = 14.
    b[18..20].copy_from_slice(&le16(0xC000));
    b[20..].fill(0x1F);
    let mut want = [0.0f32; 64];
    want[0] = -2.5;
    want[16] = 3.5;
    want[1] = -4.0;
    want[15] = 1.0;
    want[31] = 0.5;
    want[32..48].fill(-14.0);
    want[48..].fill(14.0);
    assert_bits(&dequantize(DType::Q4_0, &b, 64, "t").unwrap(), &want);
}

#[test]
fn dequantize_q4_1_by_hand() {
    // [0..2] d = 0.25 (0x3400) | [2..4] m = -1.0 (0xBC00) | [4..20] qs; y = d * q + m.
    let mut b = vec![0u8; 20]; // q = 0 -> 0.25 * 0 - 1 = -1
    b[..2].copy_from_slice(&le16(0x3400));
    b[2..4].copy_from_slice(&le16(0xBC00));
    b[4] = 0xF2; // value 0: 0.25 * 2 - 1 = -0.5;  value 16: 0.25 * 15 - 1 = 2.75
    b[9] = 0x40; // value 5: 0.25 * 0 - 1 = -1;    value 21: 0.25 * 4 - 1 = 0
    let mut want = [-1.0f32; 32];
    want[0] = -0.5;
    want[16] = 2.75;
    want[21] = 0.0;
    assert_bits(&dequantize(DType::Q4_1, &b, 32, "t").unwrap(), &want);
}

/// A 12-byte K-quant `scales` field, packed by hand from
/// scales sc = [1, 34, 3, 4, 21, 38, 5, 63] and minimums m = [2, 0, 7, 33, 17, 0, 48, 3]
/// (34 and 33 use the 6th bit of the low-sub-block fields):
/// byte j (0-3):     sc[j] | (sc[j+4] >> 4) << 6
/// byte j + 4 (0-3): m[j]  | (m[j+4] >> 4) << 6
/// byte j + 8 (0-3): (sc[j+4] & 15) | (m[j+4] & 15) << 4
const K_SCALES: [u8; 12] = [
    0x41, // 1 | (21 >> 4 = 1) << 6
    0xA2, // 34 | (38 >> 4 = 2) << 6
    0x03, // 3 | (5 >> 4 = 0) << 6
    0xC4, // 4 | (63 >> 4 = 3) << 6
    0x42, // 2 | (17 >> 4 = 1) << 6
    0x00, // 0 | (0 >> 4 = 0) << 6
    0xC7, // 7 | (48 >> 4 = 3) << 6
    0x21, // 33 | (3 >> 4 = 0) << 6
    0x15, // (21 & 15 = 5) | (17 & 15 = 1) << 4
    0x06, // (38 & 15 = 6) | (0 & 15 = 0) << 4
    0x05, // (5 & 15 = 5) | (48 & 15 = 0) << 4
    0x3F, // (63 & 15 = 15) | (3 & 15 = 3) << 4
];

#[test]
fn k_quant_scale_unpacking() {
    // Sub-blocks 0-3 read the low 6 bits of bytes j and j + 4; sub-blocks 4-7 combine the
    // nibbles of byte j + 4 with the top 2 bits of bytes j - 4 (scale) and j (minimum).
    let want = [
        (1, 2),
        (34, 0),
        (3, 7),
        (4, 33),
        (21, 17), // sc: 0x15 & 15 = 5 | (0x41 >> 6 = 1) << 4 = 21; m: 0x15 >> 4 = 1 | (0x42 >> 6 = 1) << 4 = 17
        (38, 0),  // sc: 6 | (0xA2 >> 6 = 2) << 4 = 38; m: 0 | (0x00 >> 6) << 4 = 0
        (5, 48),  // sc: 5 | (0x03 >> 6 = 0) << 4 = 5; m: 0 | (0xC7 >> 6 = 3) << 4 = 48
        (63, 3),  // sc: 15 | (0xC4 >> 6 = 3) << 4 = 63; m: 3 | (0x21 >> 6 = 0) << 4 = 3
    ];
    for (j, w) in want.into_iter().enumerate() {
        assert_eq!(scale_min_k4(j, &K_SCALES), w, "sub-block {j}");
    }
}

#[test]
fn dequantize_q4_k_by_hand() {
    // [0..2] d = 0.5 (0x3800) | [2..4] dmin = 0.25 (0x3400) | [4..16] K_SCALES |
    // [16..144] qs: chunk k (32 bytes) low nibbles -> sub-block 2k, high -> 2k + 1.
    // y = (d * sc) * q - (dmin * m).
    let mut b = vec![0u8; 144];
    b[..2].copy_from_slice(&le16(0x3800));
    b[2..4].copy_from_slice(&le16(0x3400));
    b[4..16].copy_from_slice(&K_SCALES);
    for (k, byte) in [0x21u8, 0x43, 0x65, 0xF0].into_iter().enumerate() {
        b[16 + 32 * k..16 + 32 * (k + 1)].fill(byte);
    }
    b[16] = 0x2F; // chunk 0, byte 0: value 0 gets q = 15; value 32 keeps q = 2
    b[143] = 0x1A; // chunk 3, byte 31: value 223 gets q = 10, value 255 gets q = 1
                   // Per sub-block, with the chunk's default q:
    let per_sub_block = [
        0.0,    // s0: q 1:  (0.5 * 1 = 0.5) * 1 - (0.25 * 2 = 0.5) = 0
        34.0,   // s1: q 2:  (0.5 * 34 = 17) * 2 - (0.25 * 0 = 0) = 34
        2.75,   // s2: q 3:  (0.5 * 3 = 1.5) * 3 - (0.25 * 7 = 1.75) = 2.75
        -0.25,  // s3: q 4:  (0.5 * 4 = 2) * 4 - (0.25 * 33 = 8.25) = -0.25
        48.25,  // s4: q 5:  (0.5 * 21 = 10.5) * 5 - (0.25 * 17 = 4.25) = 48.25
        114.0,  // s5: q 6:  (0.5 * 38 = 19) * 6 - 0 = 114
        -12.0,  // s6: q 0:  2.5 * 0 - (0.25 * 48 = 12) = -12
        471.75, // s7: q 15: (0.5 * 63 = 31.5) * 15 - (0.25 * 3 = 0.75) = 471.75
    ];
    let mut want: Vec<f32> = (0..256).map(|i| per_sub_block[i / 32]).collect();
    want[0] = 7.0; // 0.5 * 15 - 0.5
    want[223] = 13.0; // s6: 2.5 * 10 - 12
    want[255] = 30.75; // s7: 31.5 * 1 - 0.75
    assert_bits(&dequantize(DType::Q4_K, &b, 256, "t").unwrap(), &want);
}

#[test]
fn dequantize_q5_k_by_hand() {
    // [0..2] d = 0.5 (0x3800) | [2..4] dmin = 0.25 (0x3400) | [4..16] K_SCALES |
    // [16..48] qh: bit s of qh[l] is the 5th bit (+16) of value l of sub-block s |
    // [48..176] qs as in Q4_K. y = (d * sc) * q - (dmin * m).
    let mut b = vec![0u8; 176];
    b[..2].copy_from_slice(&le16(0x3800));
    b[2..4].copy_from_slice(&le16(0x3400));
    b[4..16].copy_from_slice(&K_SCALES);
    b[48..].fill(0x21); // q = 1 in even sub-blocks (low nibbles), 2 in odd ones (high)
    b[16] = 0b0000_0001; // qh[0]: sub-block 0, value 0 -> q = 17
    b[17] = 0b1000_0000; // qh[1]: sub-block 7, value 1 -> q = 18
    b[18] = 0b0010_0100; // qh[2]: sub-blocks 2 and 5, value 2 -> q = 17 and 18
    b[47] = 0xFF; // qh[31]: value 31 of every sub-block gets + 16
                  // (without the 5th bit, with it)
    let per_sub_block = [
        (0.0, 8.0),      // s0: 0.5 * 1 - 0.5 = 0;        0.5 * 17 - 0.5 = 8
        (34.0, 306.0),   // s1: 17 * 2 - 0 = 34;          17 * 18 - 0 = 306
        (-0.25, 23.75),  // s2: 1.5 * 1 - 1.75 = -0.25;   1.5 * 17 - 1.75 = 23.75
        (-4.25, 27.75),  // s3: 2 * 2 - 8.25 = -4.25;     2 * 18 - 8.25 = 27.75
        (6.25, 174.25),  // s4: 10.5 * 1 - 4.25 = 6.25;  10.5 * 17 - 4.25 = 174.25
        (38.0, 342.0),   // s5: 19 * 2 - 0 = 38;          19 * 18 - 0 = 342
        (-9.5, 30.5),    // s6: 2.5 * 1 - 12 = -9.5;      2.5 * 17 - 12 = 30.5
        (62.25, 566.25), // s7: 31.5 * 2 - 0.75 = 62.25;  31.5 * 18 - 0.75 = 566.25
    ];
    let mut want: Vec<f32> = (0..256).map(|i| per_sub_block[i / 32].0).collect();
    want[0] = per_sub_block[0].1;
    want[7 * 32 + 1] = per_sub_block[7].1;
    want[2 * 32 + 2] = per_sub_block[2].1;
    want[5 * 32 + 2] = per_sub_block[5].1;
    for (s, &(_, with_bit)) in per_sub_block.iter().enumerate() {
        want[32 * s + 31] = with_bit;
    }
    assert_bits(&dequantize(DType::Q5_K, &b, 256, "t").unwrap(), &want);
}

#[test]
fn dequantize_q6_k_by_hand() {
    // [0..128] ql | [128..192] qh | [192..208] scales: i8 | [208..210] d = 0.5 (0x3800).
    // Half n covers values 128n..128n+128 with ql[64n..], qh[32n..], scales[8n..]; for
    // l in 0..32: value l = low nibble of ql[l] | qh[l] bits 0-1 << 4, value l + 32 = low
    // nibble of ql[l + 32] | bits 2-3, value l + 64 = high nibble of ql[l] | bits 4-5,
    // value l + 96 = high nibble of ql[l + 32] | bits 6-7. Value i has scale index i / 16.
    // y = (d * sc) * (q - 32).
    const SC: [i8; 16] = [1, -1, 2, -2, 3, -3, 4, -4, 5, -128, 127, 6, -7, 8, 9, -10];
    let mut b = vec![0u8; 210];
    b[128..192].fill(0xAA); // every 2-bit field = 2 -> q = 0 | 2 << 4 = 32 -> q - 32 = 0
    for (dst, &sc) in b[192..208].iter_mut().zip(&SC) {
        *dst = sc as u8;
    }
    b[208..].copy_from_slice(&le16(0x3800));
    // With q - 32 = 0, y = (0.5 * sc) * 0: +0.0 where sc > 0, -0.0 where sc < 0.
    let mut want: Vec<f32> = (0..256)
        .map(|i| if SC[i / 16] < 0 { -0.0 } else { 0.0 })
        .collect();

    // Half 0, l = 0: ql[0] = 0x5F, ql[32] = 0x3C, qh[0] = 0x93 = 0b10_01_00_11.
    b[0] = 0x5F;
    b[32] = 0x3C;
    b[128] = 0x93;
    want[0] = 15.5; // q = 15 | 3 << 4 = 63 -> 31;  sc[0] = 1:  (0.5 * 1) * 31 = 15.5
    want[32] = -20.0; // q = 12 | 0 << 4 = 12 -> -20; sc[2] = 2: (0.5 * 2) * -20 = -20
    want[64] = -16.5; // q = 5 | 1 << 4 = 21 -> -11;  sc[4] = 3: (0.5 * 3) * -11 = -16.5
    want[96] = 6.0; // q = 3 | 2 << 4 = 35 -> 3;      sc[6] = 4: (0.5 * 4) * 3 = 6

    // Half 0, l = 17 (second scale of each pair): ql[17] = 0x71, ql[49] = 0x1F,
    // qh[17] = 0x28 = 0b00_10_10_00.
    b[17] = 0x71;
    b[49] = 0x1F;
    b[128 + 17] = 0x28;
    want[17] = 15.5; // q = 1 | 0 << 4 = 1 -> -31;   sc[1] = -1: (0.5 * -1) * -31 = 15.5
    want[49] = -15.0; // q = 15 | 2 << 4 = 47 -> 15; sc[3] = -2: (0.5 * -2) * 15 = -15
    want[81] = -10.5; // q = 7 | 2 << 4 = 39 -> 7;   sc[5] = -3: (0.5 * -3) * 7 = -10.5
    want[113] = 62.0; // q = 1 | 0 << 4 = 1 -> -31;  sc[7] = -4: (0.5 * -4) * -31 = 62

    // Half 1, l = 0: ql[64] = 0x00, qh[32] = 0xFF -> every q = 0 | 3 << 4 = 48 -> 16.
    b[128 + 32] = 0xFF;
    want[128] = 40.0; // sc[8] = 5:    (0.5 * 5) * 16 = 40
    want[160] = 1016.0; // sc[10] = 127: (0.5 * 127) * 16 = 1016
    want[192] = -56.0; // sc[12] = -7:  (0.5 * -7) * 16 = -56
    want[224] = 72.0; // sc[14] = 9:    (0.5 * 9) * 16 = 72

    // Half 1, l = 31: ql[95] = 0xF0, ql[127] = 0x0F, qh[63] = 0x00.
    b[95] = 0xF0;
    b[127] = 0x0F;
    b[191] = 0x00;
    want[159] = 2048.0; // q = 0 -> -32;  sc[9] = -128: (0.5 * -128) * -32 = 2048
    want[191] = -51.0; // q = 15 -> -17; sc[11] = 6:    (0.5 * 6) * -17 = -51
    want[223] = -68.0; // q = 15 -> -17; sc[13] = 8:    (0.5 * 8) * -17 = -68
    want[255] = 160.0; // q = 0 -> -32;  sc[15] = -10:  (0.5 * -10) * -32 = 160

    assert_bits(&dequantize(DType::Q6_K, &b, 256, "t").unwrap(), &want);
}

// --- Dequantization: properties on random data ---------------------------------------------

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A ChaCha8 generator; the seed is printed so that a failure can be replayed.
pub(super) fn seeded(test: &str, seed: u64) -> ChaCha8Rng {
    println!("{test}: rand_chacha seed {seed:#x}");
    ChaCha8Rng::seed_from_u64(seed)
}

/// Finite and non-finite f32s: random bit patterns, values near the f16/bf16 ranges' ends,
/// and ties.
fn random_f32s(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| match i % 3 {
            0 => f32::from_bits(rng.next_u32()),
            1 => rng.random_range(-70_000.0f32..70_000.0),
            _ => rng.random_range(-1e-4f32..1e-4),
        })
        .collect()
}

#[test]
fn float_encode_decode_matches_half() {
    let mut rng = seeded("float_encode_decode_matches_half", 0xF10A7);
    let values = random_f32s(&mut rng, 30_000);
    let n = values.len() as u64;

    let f32s = dequantize(
        DType::F32,
        &encode_float(DType::F32, &values).unwrap(),
        n,
        "t",
    );
    let want: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
    let got: Vec<u32> = f32s.unwrap().iter().map(|v| v.to_bits()).collect();
    assert_eq!(got, want);

    let f16s = encode_float(DType::F16, &values).unwrap();
    let got = dequantize(DType::F16, &f16s, n, "t").unwrap();
    for ((&v, &g), b) in values.iter().zip(&got).zip(f16s.chunks_exact(2)) {
        assert_eq!(
            u16::from_le_bytes([b[0], b[1]]),
            half::f16::from_f32(v).to_bits()
        );
        let w = half::f16::from_f32(v).to_f32();
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{v:e}"
        );
    }

    let bf16s = encode_float(DType::BF16, &values).unwrap();
    let got = dequantize(DType::BF16, &bf16s, n, "t").unwrap();
    for ((&v, &g), b) in values.iter().zip(&got).zip(bf16s.chunks_exact(2)) {
        assert_eq!(
            u16::from_le_bytes([b[0], b[1]]),
            half::bf16::from_f32(v).to_bits()
        );
        let w = half::bf16::from_f32(v).to_f32();
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{v:e}"
        );
    }
}

#[test]
fn float_encoding_rounds_to_nearest_even() {
    let round = |dtype, v: f32| {
        let b = encode_float(dtype, &[v]).unwrap();
        dequantize(dtype, &b, 1, "t").unwrap()[0]
    };
    // f16 has 10 mantissa bits: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 -> even (1);
    // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9 -> even (1 + 2^-9).
    assert_eq!(round(DType::F16, 1.0 + 2f32.powi(-11)), 1.0);
    assert_eq!(
        round(DType::F16, 1.0 + 3.0 * 2f32.powi(-11)),
        1.0 + 2f32.powi(-9)
    );
    assert_eq!(
        round(DType::F16, 1.0 + 1.5 * 2f32.powi(-11)),
        1.0 + 2f32.powi(-10)
    );
    // 65520 is halfway between the largest f16, 65504, and 65536 (odd -> even) -> inf.
    assert_eq!(round(DType::F16, 65520.0), f32::INFINITY);
    assert_eq!(round(DType::F16, 65519.0), 65504.0);
    // bf16 has 7 mantissa bits: the same with 2^-8 and 2^-7.
    assert_eq!(round(DType::BF16, 1.0 + 2f32.powi(-8)), 1.0);
    assert_eq!(
        round(DType::BF16, 1.0 + 3.0 * 2f32.powi(-8)),
        1.0 + 2f32.powi(-6)
    );
    assert_eq!(
        round(DType::BF16, -(1.0 + 3.0 * 2f32.powi(-8))),
        -(1.0 + 2f32.powi(-6))
    );
    assert!(round(DType::BF16, f32::NAN).is_nan());
}

/// The smallest f16 ≥ `x` (x finite, within the f16 range).
pub(super) fn f16_at_least(x: f32) -> half::f16 {
    let mut h = half::f16::from_f32(x);
    while h.to_f32() < x {
        let bits = h.to_bits();
        h = half::f16::from_bits(match bits {
            0x8000 => 0x0001,              // -0 -> smallest positive
            b if b & 0x8000 != 0 => b - 1, // negative: toward zero
            b => b + 1,
        });
    }
    h
}

/// The largest f16 ≤ `x`.
pub(super) fn f16_at_most(x: f32) -> half::f16 {
    -f16_at_least(-x)
}

/// Random blocks of 32 with a per-block magnitude from 1e-3 to 1e3; one block all zero.
pub(super) fn random_blocks(rng: &mut ChaCha8Rng, blocks: usize, offset: bool) -> Vec<f32> {
    let mut x = Vec::with_capacity(blocks * 32);
    for i in 0..blocks {
        let scale = 10f32.powf(rng.random_range(-3.0..3.0));
        let shift = if offset {
            rng.random_range(-2.0..2.0) * scale
        } else {
            0.0
        };
        for _ in 0..32 {
            x.push(if i == 7 {
                0.0
            } else {
                shift + scale * rng.random_range(-1.0f32..1.0)
            });
        }
    }
    x
}

/// Symmetric quantizer for Q8_0 (`levels` 127) and Q4_0 (`levels` 7): `d` the smallest f16
/// with `levels * d >= max |x|`, `q = round(x / d)`; returns the bytes and each block's `d`.
fn quantize_symmetric(dtype: DType, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = Vec::new();
    let mut ds = Vec::new();
    for block in x.chunks_exact(32) {
        let amax = block.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let levels = if dtype == DType::Q8_0 { 127.0 } else { 7.0 };
        let d = f16_at_least(amax / levels);
        let mut d32 = d.to_f32();
        while levels * d32 < amax {
            d32 = f16_at_least(d32 * (1.0 + 1e-3)).to_f32();
        }
        let d = half::f16::from_f32(d32);
        let q = |v: f32| {
            if d32 == 0.0 {
                0
            } else {
                (v / d32).round() as i32
            }
        };
        bytes.extend_from_slice(&d.to_le_bytes());
        if dtype == DType::Q8_0 {
            bytes.extend(block.iter().map(|&v| q(v) as i8 as u8));
        } else {
            let (lo, hi) = block.split_at(16);
            bytes.extend(
                lo.iter()
                    .zip(hi)
                    .map(|(&a, &b)| ((q(a) + 8) as u8) | (((q(b) + 8) as u8) << 4)),
            );
        }
        ds.push(d32);
    }
    (bytes, ds)
}

#[test]
fn q8_0_and_q4_0_round_trip_within_half_a_step() {
    let mut rng = seeded("q8_0_and_q4_0_round_trip_within_half_a_step", 0x0880);
    let x = random_blocks(&mut rng, 1000, false);
    for dtype in [DType::Q8_0, DType::Q4_0] {
        let (bytes, ds) = quantize_symmetric(dtype, &x);
        let y = dequantize(dtype, &bytes, x.len() as u64, "t").unwrap();
        for (i, (&x, &y)) in x.iter().zip(&y).enumerate() {
            let d = ds[i / 32];
            // Half a step, plus the rounding of x / d in f32 (q * d itself is exact).
            let tol = d * (0.5 + 1e-5);
            assert!((x - y).abs() <= tol, "{dtype} value {i}: {x} -> {y}, d {d}");
        }
    }
}

#[test]
fn q4_1_round_trip_within_half_a_step() {
    let mut rng = seeded("q4_1_round_trip_within_half_a_step", 0x0441);
    let x = random_blocks(&mut rng, 1000, true);
    let mut bytes = Vec::new();
    let mut steps = Vec::new();
    for block in x.chunks_exact(32) {
        // m the largest f16 <= min, d the smallest f16 with m + 15 d >= max: every value
        // lies in [m, m + 15 d], so q = round((x - m) / d) needs no clamping.
        let lo = block.iter().copied().fold(f32::INFINITY, f32::min);
        let hi = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let m = f16_at_most(lo);
        let m32 = m.to_f32();
        let mut d32 = f16_at_least((hi - m32) / 15.0).to_f32();
        while m32 + 15.0 * d32 < hi {
            d32 = f16_at_least(d32 * (1.0 + 1e-3)).to_f32();
        }
        let q = |v: f32| {
            if d32 == 0.0 {
                0
            } else {
                ((v - m32) / d32).round() as u8
            }
        };
        bytes.extend_from_slice(&half::f16::from_f32(d32).to_le_bytes());
        bytes.extend_from_slice(&m.to_le_bytes());
        let (a, b) = block.split_at(16);
        bytes.extend(a.iter().zip(b).map(|(&a, &b)| q(a) | (q(b) << 4)));
        steps.push(d32);
    }
    let y = dequantize(DType::Q4_1, &bytes, x.len() as u64, "t").unwrap();
    for (i, (&x, &y)) in x.iter().zip(&y).enumerate() {
        let d = steps[i / 32];
        // Half a step, plus the f32 rounding of (x - m) / d and of d * q + m.
        let tol = d * (0.5 + 1e-5) + f32::EPSILON * y.abs();
        assert!((x - y).abs() <= tol, "value {i}: {x} -> {y}, d {d}");
    }
}

// --- Dequantization: errors ----------------------------------------------------------------

#[test]
fn wrong_lengths_are_errors_naming_the_tensor() {
    let name = "blk.3.attn_q.weight";
    let err = dequantize(DType::Q4_0, &[0; 17], 32, name).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(name) && msg.contains("18") && msg.contains("17"),
        "{msg}"
    );

    let err = dequantize(DType::F32, &[0; 7], 2, name)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(name) && err.contains('8') && err.contains('7'),
        "{err}"
    );

    // Too many bytes is as wrong as too few.
    let err = dequantize_into(DType::Q8_0, &[0; 68], &mut [0.0; 32], name).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(name) && msg.contains("34") && msg.contains("68"),
        "{msg}"
    );

    // Not a whole number of blocks.
    let err = dequantize_into(DType::Q6_K, &[0; 210], &mut [0.0; 255], name).unwrap_err();
    assert!(err.to_string().contains(name), "{err}");

    // A huge element count fails on the byte count, before allocating anything.
    let err = dequantize(DType::Q4_K, &[0; 144], 1 << 60, name).unwrap_err();
    assert!(err.to_string().contains(name), "{err}");

    let err = encode_float(DType::Q4_K, &[1.0]).unwrap_err();
    assert!(err.to_string().contains("Q4_K"), "{err}");
}

#[test]
fn dequantize_into_fills_the_slice_and_empty_is_fine() {
    let mut out = [7.0f32; 32];
    let mut b = [0u8; 34];
    b[..2].copy_from_slice(&le16(0x3C00)); // d = 1
    b[2..].fill(0xFE); // q = -2 -> -2 * 1 = -2
    dequantize_into(DType::Q8_0, &b, &mut out, "t").unwrap();
    assert_eq!(out, [-2.0; 32]);
    for dtype in DType::ALL {
        assert!(dequantize(dtype, &[], 0, "t").unwrap().is_empty());
    }
}
