//! The VNNI tiles against the row path.

use super::*;
use crate::backend::cpu::fused::tests::random_row;
use crate::backend::cpu::test_rng::Lcg;

/// `rows` random rows of `dtype` (the fused rows' tests' generator).
fn random_rows(rng: &mut Lcg, dtype: DType, rows: usize, blocks: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rows {
        out.extend(random_row(rng, dtype, blocks));
    }
    out
}

/// The tiles give the row path's bits for every covered type, at block counts that are
/// odd, even and past a multiple of eight and token counts that leave partial tiles: a
/// matrix kept in tiles (every count from one token), and one kept as rows and repacked as
/// its product goes (from [`MIN_TOKENS`]; rows past whole tiles by rows), each against the
/// row path one token at a time. A row read back from the tiles is the stored one.
#[test]
fn tiles_match_the_row_path_bit_for_bit() {
    let mut rng = Lcg(0x7113);
    for dtype in [
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
    ] {
        if !available(dtype) {
            eprintln!("no VNNI tiles for {} on this CPU", dtype.name());
            continue;
        }
        for (rows, blocks, tokens) in [
            (16, 1, 1),
            (32, 3, 2),
            (48, 8, 3),
            (32, 13, 5),
            (35, 13, 15),
            (16, 18, 17),
            (64, 9, 33),
            (16, 64, 5),
            (32, 256, 2),
        ] {
            let cols = blocks * QK;
            let data = random_rows(&mut rng, dtype, rows, blocks);
            let tiled =
                crate::backend::cpu::QMatrix::new(dtype, rows, cols, data.clone(), "w").unwrap();
            let by_rows =
                crate::backend::cpu::QMatrix::stored(dtype, rows, cols, data, "w").unwrap();
            assert_eq!(tiled.is_tiled(), rows % ROWS == 0, "{rows} rows");
            assert!(!by_rows.is_tiled());
            let x: Vec<f32> = (0..tokens * cols).map(|_| rng.f32() * 3.0).collect();
            let mut want = vec![0.0f32; tokens * rows];
            for (x, y) in x.chunks_exact(cols).zip(want.chunks_exact_mut(rows)) {
                by_rows.matmul(x, None, y);
            }
            let mut kept = vec![0.0f32; tokens * rows];
            tiled.matmul(&x, None, &mut kept);
            let mut repacked = vec![0.0f32; tokens * rows];
            by_rows.matmul(&x, None, &mut repacked);
            for (i, ((a, b), w)) in kept.iter().zip(&repacked).zip(&want).enumerate() {
                let case = format!(
                    "{} rows {rows} blocks {blocks} tokens {tokens}: value {i}",
                    dtype.name()
                );
                assert_eq!(
                    a.to_bits(),
                    w.to_bits(),
                    "kept in tiles, {case}: {a} vs {w}"
                );
                assert_eq!(b.to_bits(), w.to_bits(), "repacked, {case}: {b} vs {w}");
            }
            let (mut a, mut b) = (vec![0.0f32; cols], vec![0.0f32; cols]);
            for r in [0, rows / 2, rows - 1] {
                tiled.row_f32(r, &mut a).unwrap();
                by_rows.row_f32(r, &mut b).unwrap();
                assert!(
                    a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "row {r}"
                );
            }
            // as many bytes in tiles as in rows, and one block more per tile where a row's
            // blocks are odd
            let block_bytes = by_rows.bytes() / rows / blocks;
            let pad = match tiled.is_tiled() {
                true => (blocks % 2) * rows * block_bytes,
                false => 0,
            };
            assert_eq!(tiled.bytes(), by_rows.bytes() + pad, "bytes in tiles");
        }
    }
}

/// The AVX2 tiles give the row path's bits for every covered type, whatever tiles this CPU's
/// matrices run on (a CPU with VNNI runs these too): one tile and two, block counts odd,
/// even and past eight, one to five tokens (a pass's two, and one left over). Where the CPU
/// has AVX-512, the SSE2 repacking writes the AVX-512 one's bytes.
#[test]
fn avx2_tiles_match_the_row_path_bit_for_bit() {
    if !crate::backend::cpu::dot::has_avx2_f16c() {
        eprintln!("no AVX2 and F16C on this CPU");
        return;
    }
    let mut rng = Lcg(0xa2f1);
    for dtype in [
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
    ] {
        for (rows, blocks, tokens) in [
            (16, 1, 1),
            (32, 3, 2),
            (16, 8, 3),
            (32, 13, 5),
            (16, 18, 1),
            (32, 64, 4),
            (16, 256, 2),
        ] {
            let cols = blocks * QK;
            let data = random_rows(&mut rng, dtype, rows, blocks);
            let by_rows =
                crate::backend::cpu::QMatrix::stored(dtype, rows, cols, data.clone(), "w").unwrap();
            let row_bytes = data.len() / rows;
            let x: Vec<f32> = (0..tokens * cols).map(|_| rng.f32() * 3.0).collect();
            let mut want = vec![0.0f32; tokens * rows];
            for (x, y) in x.chunks_exact(cols).zip(want.chunks_exact_mut(rows)) {
                by_rows.matmul(x, None, y);
            }
            let mut q8 = Q8Rows::default();
            q8.quantize(&x, cols);
            let corr = corrections(dtype, &q8);
            let mut tile = Tile::on(dtype, Isa::Avx2).unwrap();
            for g in 0..rows / ROWS {
                let stored = &data[g * ROWS * row_bytes..][..ROWS * row_bytes];
                tile.fill(stored, row_bytes);
                if crate::backend::cpu::dot::has_vnni() {
                    let filler = tile.filler(row_bytes);
                    let mut sse2 = vec![0u8; tile.bytes()];
                    // SAFETY: `stored` holds the 16 rows and `sse2` is a tile's bytes.
                    unsafe { filler.transpose_sse2(&mut sse2, stored) };
                    assert!(
                        sse2 == tile.lines.tile(0),
                        "{}: SSE2 repacking",
                        dtype.name()
                    );
                }
                let mut out = vec![0.0f32; ROWS * tokens];
                tile.product(0, &q8, &corr, &mut out);
                for t in 0..tokens {
                    for r in 0..ROWS {
                        let (a, w) = (out[r * tokens + t], want[t * rows + g * ROWS + r]);
                        assert_eq!(
                            a.to_bits(),
                            w.to_bits(),
                            "{} blocks {blocks} tokens {tokens}: tile {g} row {r} token {t}: {a} vs {w}",
                            dtype.name()
                        );
                    }
                }
            }
        }
    }
}
