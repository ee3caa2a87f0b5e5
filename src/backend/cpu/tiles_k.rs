//! Q4_K matrices on AVX-512 VNNI (AVX2 with F16C: [`avx2`]) in tiles of 16 weight rows × up
//! to 4 tokens, as
//! [`super::tiles_vnni`] does for the 32-value types: a Q4_K_M model's attention and gate/up
//! matrices, which the row-at-a-time path ([`super::fused_k`]) meets one row at a time, each
//! 64 values ending in a horizontal sum.
//!
//! A super-block (256 values, eight sub-blocks of 32 with a 6-bit scale and min each) is kept
//! as 32 registers of nibbles, lane `j` holding four stored bytes of row `j`; the low nibbles
//! of a register are four values of one half-block and the high nibbles four of the half-block
//! 32 values on. A token's four activation bytes are broadcast and one `vpdpbusd` adds four
//! products to each row's sum; a half-block is four of them. The scales and mins are kept
//! unpacked (a byte each per row), so the 16 rows' `d · sc` and `dmin · m` are one vector
//! product each.
//!
//! The bits are those of the row path: the same exact integer sums per half-block, the same
//! f32 products `f32(Σ) · ((d · sc) · d_q)`, added to four accumulators by half-block index
//! modulo four in the order of the half-blocks, summed as `(a0 + a1) + (a2 + a3)`, plus the
//! mins' part `Σ −(dmin · m) · s` as [`super::dot::dot_f32`] adds it (eight lanes by
//! sub-block, summed in order). The tests hold the tiles to the unpacked row bit for bit.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::quant::{Q8Rows, TILE_ROWS as ROWS};
use super::tile_lines::TileLines;
use crate::dtype::DType;

/// Values per super-block.
const QK_K: usize = 256;
/// Bytes of a stored super-block: `d`, `dmin` (f16), 12 bytes of scales and mins, 128 of
/// nibbles.
const BLOCK: usize = 144;
/// 4-byte words of nibbles per super-block (one register of them per tile).
const WORDS: usize = 32;
/// Cache lines of one super-block of a tile: 32 of nibbles, one of the 16 rows' `d` and
/// `dmin`, two of scales, two of mins.
const LINES: usize = WORDS + 5;
/// The line of the 16 `d` (then the 16 `dmin`) in a super-block's lines.
const D_LINE: usize = WORDS;
/// The first of the two lines of scales (`[8 sub-blocks, 16 rows]`).
const SCALES_LINE: usize = WORDS + 1;
/// The first of the two lines of mins (`[8 sub-blocks, 16 rows]`).
const MINS_LINE: usize = WORDS + 3;
/// Tokens per pass (their accumulators stay in registers).
pub(super) const TOKENS: usize = 4;
/// Super-blocks ahead of the one multiplied whose lines are prefetched into L2 (18.5 KiB
/// ahead; in [`TileLines`]' one stream the CPU's own prefetch does most of it, and 4, 8 or
/// 16 ahead, into L1 or L2, were within the 2-core AMD EPYC's noise of each other).
const PREFETCH: usize = 8;

/// Whether [`KTiles`] computes products of `dtype` on this CPU.
pub(super) fn available(dtype: DType) -> bool {
    dtype == DType::Q4_K && super::tiles_vnni::isa().is_some()
}

/// A Q4_K matrix's rows repacked in tiles of 16 ([`TileLines`]). A super-block of a tile is
/// [`LINES`] cache lines: its 32 words of nibbles with lane `j` of each line row `j`'s, the
/// 16 rows' `d` and `dmin` as the f16 stored, and their eight scales and mins unpacked to a
/// byte each.
#[derive(Debug, Clone, Default)]
pub(super) struct KTiles(TileLines);

/// The 12 stored bytes of eight 6-bit scales and mins: the inverse of
/// [`super::fused_k::k_scales_and_mins`] (every one of the 96 bits is used, so the two are a
/// bijection).
fn pack_scales_and_mins(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4);
    }
    s
}

impl KTiles {
    /// Room for `tiles` tiles of rows of `row_bytes` (whole super-blocks), filled by
    /// [`Self::fill_tile`] on each of [`Self::tiles_mut`].
    pub(super) fn new(tiles: usize, row_bytes: usize) -> Self {
        let blocks = row_bytes / BLOCK;
        assert_eq!(
            blocks * BLOCK,
            row_bytes,
            "Q4_K rows are whole super-blocks"
        );
        Self(TileLines::new(tiles, blocks, LINES))
    }

    /// The rows of `data` (a multiple of 16 rows of `row_bytes`) repacked, one tile after
    /// the other on this thread (the tests').
    #[cfg(test)]
    pub(super) fn fill(&mut self, data: &[u8], row_bytes: usize) {
        *self = Self::new(data.len() / (ROWS * row_bytes), row_bytes);
        for (t, tile) in self.tiles_mut().into_iter().enumerate() {
            Self::fill_tile(tile, &data[t * ROWS * row_bytes..], row_bytes);
        }
    }

    /// Each tile's bytes, to be filled apart.
    pub(super) fn tiles_mut(&mut self) -> Vec<&mut [u8]> {
        self.0.tiles_mut()
    }

    /// Repacks the 16 rows at the start of `data` (`16 × row_bytes`) into one tile's bytes.
    pub(super) fn fill_tile(tile: &mut [u8], data: &[u8], row_bytes: usize) {
        let blocks = row_bytes / BLOCK;
        assert!(data.len() >= ROWS * row_bytes && tile.len() == blocks * LINES * 64);
        for j in 0..ROWS {
            let row = &data[j * row_bytes..][..row_bytes];
            for (b, block) in row.chunks_exact(BLOCK).enumerate() {
                let dst = &mut tile[b * LINES * 64..][..LINES * 64];
                dst[D_LINE * 64 + 2 * j..][..2].copy_from_slice(&block[0..2]);
                dst[D_LINE * 64 + 32 + 2 * j..][..2].copy_from_slice(&block[2..4]);
                let (sc, m) = super::fused_k::k_scales_and_mins(&block[4..16]);
                for s in 0..8 {
                    dst[SCALES_LINE * 64 + s * ROWS + j] = sc[s];
                    dst[MINS_LINE * 64 + s * ROWS + j] = m[s];
                }
                for (w, word) in block[16..].chunks_exact(4).enumerate() {
                    dst[w * 64 + j * 4..][..4].copy_from_slice(word);
                }
            }
        }
    }

    /// Bytes held (the rows' and 64 more per super-block and tile: the scales and mins
    /// unpacked).
    pub(super) fn bytes(&self) -> usize {
        self.0.bytes()
    }

    /// Row `r` dequantized into `out` (`[blocks · 256]`): each super-block's stored bytes put
    /// back together (on the stack) and dequantized as the stored row would be.
    pub(super) fn row_f32(&self, r: usize, out: &mut [f32]) -> crate::error::Result<()> {
        let (tile, j) = (self.0.tile(r / ROWS), r % ROWS);
        let mut stored = [0u8; BLOCK];
        for (b, out) in out.chunks_exact_mut(QK_K).take(self.0.blocks()).enumerate() {
            let src = &tile[b * LINES * 64..][..LINES * 64];
            stored[0..2].copy_from_slice(&src[D_LINE * 64 + 2 * j..][..2]);
            stored[2..4].copy_from_slice(&src[D_LINE * 64 + 32 + 2 * j..][..2]);
            let sc: [u8; 8] = std::array::from_fn(|s| src[SCALES_LINE * 64 + s * ROWS + j]);
            let m: [u8; 8] = std::array::from_fn(|s| src[MINS_LINE * 64 + s * ROWS + j]);
            stored[4..16].copy_from_slice(&pack_scales_and_mins(&sc, &m));
            for w in 0..WORDS {
                stored[16 + 4 * w..][..4].copy_from_slice(&src[w * 64 + j * 4..][..4]);
            }
            crate::dtype::dequantize_into(DType::Q4_K, &stored, out, "row")?;
        }
        Ok(())
    }

    /// `out[r · tokens + t]` (`r` < 16) for row `16·g + r` and every token `t` of `q8`, whose
    /// rows have the tiles' width.
    pub(super) fn product(&self, g: usize, q8: &Q8Rows, out: &mut [f32]) {
        let tokens = q8.q.len() / q8.cols.max(1);
        let cols = self.0.blocks() * QK_K;
        assert!(out.len() >= ROWS * tokens && q8.cols == cols);
        assert_eq!(self.0.tile(g).len(), self.0.blocks() * LINES * 64);
        assert!(q8.d.len() >= tokens * cols / 16 && q8.s.len() >= tokens * cols / 32);
        // SAFETY: tiles are made only where the CPU has VNNI or AVX2 and F16C (`available`);
        // the lengths were checked above.
        unsafe {
            match super::tiles_vnni::isa() {
                Some(super::tiles_vnni::Isa::Vnni) => in_fours(self, g, q8, tokens, out),
                _ => avx2::in_twos(self, g, q8, out),
            }
        }
    }

    /// Tile `g`'s 16 rows' products with tokens `first..first + N` of `q8`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VNNI and F16C; `q8`'s rows are the tiles' width and hold
    /// the tokens asked for; tile `g` exists.
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
    unsafe fn pass<const N: usize>(&self, g: usize, q8: &Q8Rows, first: usize) -> [[f32; ROWS]; N] {
        let blocks = self.0.blocks();
        let cols = blocks * QK_K;
        let halves = cols / 16;
        let tile = self.0.tile(g).as_ptr();
        let mut acc = [[_mm512_setzero_ps(); 4]; N];
        let mask = _mm512_set1_epi8(0x0F);
        for b in 0..blocks {
            // SAFETY (every access of this block): super-block `b` of tile `g` lies inside the
            // lines and each token's values, scales and sums (the caller's promise, the
            // lengths asserted by `product`).
            unsafe {
                let p = tile.add(b * LINES * 64);
                // PREFETCH super-blocks on (into the next tiles at a tile's end): a decode
                // step streams the tiles from memory
                let ahead = p.wrapping_add(PREFETCH * LINES * 64);
                for l in 0..LINES {
                    _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(l * 64).cast());
                }
                let scale_of = |s: usize| {
                    let x = _mm_loadu_si128(p.add(SCALES_LINE * 64 + s * ROWS).cast());
                    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(x))
                };
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(D_LINE * 64).cast()));
                for pair in 0..4 {
                    // sub-blocks 2·pair and 2·pair + 1: `d · sc` once each for the 16 rows
                    let scales = [
                        _mm512_mul_ps(d, scale_of(2 * pair)),
                        _mm512_mul_ps(d, scale_of(2 * pair + 1)),
                    ];
                    // half-blocks 4·pair + 0..4: the low nibbles of words 0–3 and 4–7, then
                    // the high nibbles of the same (sub-blocks 2·pair and 2·pair + 1); each
                    // word is loaded again for its high nibbles rather than kept (registers
                    // go to the tokens' accumulators)
                    for k in 0..4 {
                        let (high, from) = (k >= 2, 8 * pair + 4 * (k % 2));
                        let w: [__m512i; 4] = std::array::from_fn(|i| {
                            let v = _mm512_load_si512(p.add((from + i) * 64).cast());
                            let v = if high { _mm512_srli_epi16::<4>(v) } else { v };
                            _mm512_and_si512(v, mask)
                        });
                        let hb = 4 * pair + k;
                        let scale = scales[k / 2];
                        for (t, acc) in acc.iter_mut().enumerate() {
                            let h = (first + t) * halves + b * 16 + hb;
                            let qp = q8.q.as_ptr().add((first + t) * cols + b * QK_K + 16 * hb);
                            let mut sum = _mm512_setzero_si512();
                            for (i, w) in w.iter().enumerate() {
                                let word =
                                    _mm512_set1_epi32(qp.add(4 * i).cast::<i32>().read_unaligned());
                                sum = _mm512_dpbusd_epi32(sum, *w, word);
                            }
                            let c = _mm512_mul_ps(scale, _mm512_set1_ps(*q8.d.as_ptr().add(h)));
                            acc[k] =
                                _mm512_add_ps(acc[k], _mm512_mul_ps(_mm512_cvtepi32_ps(sum), c));
                        }
                    }
                }
            }
        }
        // SAFETY: the tokens' block sums cover the row (the caller's promise).
        let mins = unsafe { self.mins_parts::<N>(tile, q8, first) };
        let mut out = [[0.0f32; ROWS]; N];
        for ((o, acc), mins) in out.iter_mut().zip(&acc).zip(mins) {
            let dot = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
            // SAFETY: a 64-byte store into 16 f32.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), _mm512_add_ps(dot, mins)) };
        }
        out
    }

    /// The mins' part of the 16 rows' products of the tile at `tile` with tokens
    /// `first..first + N`: for each token `Σ −(dmin · m) · s` over the sub-blocks, as
    /// `dot_f32` adds it (eight lanes by sub-block, each super-block's in order, then the
    /// lanes summed from −0). Lane by lane, so that each `−(dmin · m)` is made once for all
    /// the tokens.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and F16C; `tile` is a tile of these lines; `q8` holds the tokens
    /// at the tiles' width.
    #[target_feature(enable = "avx2,f16c,avx512f")]
    unsafe fn mins_parts<const N: usize>(
        &self,
        tile: *const u8,
        q8: &Q8Rows,
        first: usize,
    ) -> [__m512; N] {
        let blocks = self.0.blocks();
        let subs = blocks * 8;
        let sign = _mm512_set1_ps(-0.0);
        let mut total = [sign; N];
        for s in 0..8 {
            let mut lane = [_mm512_setzero_ps(); N];
            for b in 0..blocks {
                // SAFETY: super-block `b`'s `dmin`s and mins lie in the tile, its sub-blocks'
                // sums in each token's (the caller's promise).
                unsafe {
                    let p = tile.add(b * LINES * 64);
                    let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(D_LINE * 64 + 32).cast()));
                    let m = _mm_loadu_si128(p.add(MINS_LINE * 64 + s * ROWS).cast());
                    let m = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(m));
                    // −(dmin · m): the row path's offset, its sign flipped exactly
                    let offset = _mm512_xor_ps(_mm512_mul_ps(dmin, m), sign);
                    for (t, lane) in lane.iter_mut().enumerate() {
                        let sb = *q8.s.as_ptr().add((first + t) * subs + b * 8 + s);
                        *lane = _mm512_add_ps(*lane, _mm512_mul_ps(offset, _mm512_set1_ps(sb)));
                    }
                }
            }
            for (total, lane) in total.iter_mut().zip(lane) {
                *total = _mm512_add_ps(*total, lane);
            }
        }
        total
    }
}

impl Pass for KTiles {
    unsafe fn tokens<const N: usize>(
        &self,
        g: usize,
        q8: &Q8Rows,
        first: usize,
    ) -> [[f32; ROWS]; N] {
        // SAFETY: the caller's promise.
        unsafe { self.pass::<N>(g, q8, first) }
    }
}

/// A K-quant matrix's tiled pass over `N` tokens: tile `g`'s 16 rows' products with tokens
/// `first..first + N` of `q8`.
pub(super) trait Pass {
    /// # Safety
    /// The CPU has AVX-512 F, BW and VNNI and F16C; `q8`'s rows are the tiles' width and
    /// hold the tokens asked for; tile `g` is filled.
    unsafe fn tokens<const N: usize>(
        &self,
        g: usize,
        q8: &Q8Rows,
        first: usize,
    ) -> [[f32; ROWS]; N];
}

/// `N` tokens' sums in the first `N` of four slots.
fn widen<const N: usize>(a: [[f32; ROWS]; N]) -> [[f32; ROWS]; TOKENS] {
    std::array::from_fn(|k| a.get(k).copied().unwrap_or([0.0; ROWS]))
}

/// Tile `g`'s products with the `tokens` of `q8` in passes of at most four tokens, into
/// `out[r · tokens + t]`.
///
/// # Safety
/// As [`Pass::tokens`], for every token of `q8`.
pub(super) unsafe fn in_fours<T: Pass>(
    tiles: &T,
    g: usize,
    q8: &Q8Rows,
    tokens: usize,
    out: &mut [f32],
) {
    let mut first = 0;
    while first < tokens {
        let n = (tokens - first).min(TOKENS);
        // SAFETY: the caller's promise, for tokens `first..first + n`.
        let sums = unsafe {
            match n {
                1 => widen(tiles.tokens::<1>(g, q8, first)),
                2 => widen(tiles.tokens::<2>(g, q8, first)),
                3 => widen(tiles.tokens::<3>(g, q8, first)),
                _ => tiles.tokens::<TOKENS>(g, q8, first),
            }
        };
        for (k, row_sums) in sums.iter().take(n).enumerate() {
            for (r, &v) in row_sums.iter().enumerate() {
                out[r * tokens + first + k] = v;
            }
        }
        first += n;
    }
}

#[path = "tiles_k_avx2.rs"]
pub(in crate::backend::cpu) mod avx2;

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::backend::cpu::fused_k::tests::random_row;
    use crate::backend::cpu::quant::UnpackedRow;
    use crate::backend::cpu::test_rng::Lcg;

    #[test]
    fn scales_and_mins_pack_back_to_their_bytes() {
        let mut rng = Lcg(0x5ca1e);
        for _ in 0..20_000 {
            let s: [u8; 12] = std::array::from_fn(|_| rng.next() as u8);
            let (sc, m) = super::super::fused_k::k_scales_and_mins(&s);
            assert_eq!(pack_scales_and_mins(&sc, &m), s);
        }
    }

    /// `fill` / `product` / `row_f32` of a tile type: its products equal the unpacked row's
    /// dot bit for bit, for 16 and 32 random rows of `dtype` (`block` bytes per super-block),
    /// one to nine super-blocks and one to nine tokens; its rows read back as stored.
    pub(in crate::backend::cpu) fn check_tiles<T: Default>(
        dtype: DType,
        block: usize,
        fill: fn(&mut T, &[u8], usize),
        product: fn(&T, &Q8Rows, &mut [f32]),
        row_f32: fn(&T, usize, &mut [f32]) -> crate::error::Result<()>,
    ) {
        let mut rng = Lcg(0x71e5 ^ block as u64);
        for blocks in [1usize, 2, 3, 8, 9] {
            let cols = blocks * QK_K;
            for rows in [16usize, 32] {
                let data: Vec<u8> = (0..rows)
                    .flat_map(|_| random_row(&mut rng, dtype, blocks))
                    .collect();
                let row_bytes = blocks * block;
                let tiles: Vec<T> = data
                    .chunks_exact(ROWS * row_bytes)
                    .map(|d| {
                        let mut t = T::default();
                        fill(&mut t, d, row_bytes);
                        t
                    })
                    .collect();
                let row = |g: usize, r: usize| &data[(g * ROWS + r) * row_bytes..][..row_bytes];
                for tokens in [1usize, 2, 3, 4, 5, 9] {
                    let x: Vec<f32> = (0..tokens * cols).map(|_| rng.f32() * 3.0).collect();
                    let mut q8 = Q8Rows::default();
                    q8.quantize(&x, cols);
                    for (g, tile) in tiles.iter().enumerate() {
                        let mut got = vec![f32::NAN; ROWS * tokens];
                        product(tile, &q8, &mut got);
                        for r in 0..ROWS {
                            let mut unpacked = UnpackedRow::with_cols(cols);
                            unpacked.unpack(dtype, row(g, r));
                            for t in 0..tokens {
                                let (q, d, s) = q8.row(t);
                                let want = unpacked.dot(q, d, s);
                                let got = got[r * tokens + t];
                                assert_eq!(
                                    got.to_bits(),
                                    want.to_bits(),
                                    "{} × {blocks}, row {r} of tile {g}, token {t} of {tokens}: \
                                     {got} vs {want}",
                                    dtype.name()
                                );
                            }
                        }
                    }
                }
                for (g, tile) in tiles.iter().enumerate() {
                    for r in 0..ROWS {
                        let mut want = vec![0.0f32; cols];
                        crate::dtype::dequantize_into(dtype, row(g, r), &mut want, "row").unwrap();
                        let mut got = vec![f32::NAN; cols];
                        row_f32(tile, r, &mut got).unwrap();
                        assert!(got
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()));
                    }
                }
            }
        }
    }

    #[test]
    fn tiles_match_the_unpacked_rows_bit_for_bit() {
        if !available(DType::Q4_K) {
            eprintln!("no Q4_K tiles on this CPU");
            return;
        }
        check_tiles(
            DType::Q4_K,
            BLOCK,
            KTiles::fill,
            |t, q8, out| t.product(0, q8, out),
            KTiles::row_f32,
        );
    }

    /// The AVX2 passes, whatever tiles this CPU's matrices run on (a CPU with VNNI runs them
    /// here too).
    #[test]
    fn avx2_tiles_match_the_unpacked_rows_bit_for_bit() {
        if !crate::backend::cpu::dot::has_avx2_f16c() {
            eprintln!("no AVX2 and F16C on this CPU");
            return;
        }
        check_tiles(
            DType::Q4_K,
            BLOCK,
            KTiles::fill,
            // SAFETY: the CPU has AVX2 and F16C (checked above).
            |t, q8, out| unsafe { avx2::in_twos(t, 0, q8, out) },
            KTiles::row_f32,
        );
    }
}
