//! Q6_K matrices on AVX-512 VNNI in tiles of 16 weight rows × up to 4 tokens, as
//! [`super::tiles_k`] does for Q4_K: a Q4_K_M model's V and down matrices (and often its LM
//! head).
//!
//! A super-block (256 values of 6 bits, a signed 8-bit scale per 16) is kept as its stored
//! words, lane `j` of each 64-byte register row `j`'s: 32 registers of low nibbles (`ql`) and
//! 16 of high bit pairs (`qh`), as many bytes as the rows. Four values of a half-block are a
//! nibble of an `ql` word and two bits of a `qh` word, put together as `value + 32` (0..63,
//! unsigned); one `vpdpbusd` per word and token adds four products to each row's sum, which
//! starts at `−32 · Σ q` so that it ends exact.
//!
//! The bits are those of the row path: the same exact integer sums per half-block, the same
//! f32 products `f32(Σ) · ((d · sc) · d_q)` added to four accumulators by half-block index
//! modulo four in order, summed as `(a0 + a1) + (a2 + a3)`. The tests hold the tiles to the
//! unpacked row bit for bit.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::quant::{Q8Rows, TILE_ROWS as ROWS};
use super::tiles_k::{in_fours, Pass};
use crate::dtype::DType;

/// Values per super-block.
const QK_K: usize = 256;
/// Bytes of a stored super-block: 128 of low nibbles, 64 of high bit pairs, 16 scales, `d`.
const BLOCK: usize = 210;
/// 4-byte words of low nibbles per super-block.
const QL_WORDS: usize = 32;
/// 4-byte words of high bit pairs per super-block.
const QH_WORDS: usize = 16;
/// Tile bytes of values per super-block.
const STRIDE: usize = (QL_WORDS + QH_WORDS) * 64;
/// Super-blocks ahead of the one multiplied whose values are prefetched.
const PREFETCH: usize = 2;

/// Whether [`Q6kTile`] computes products of `dtype` on this CPU.
pub(super) fn available(dtype: DType) -> bool {
    dtype == DType::Q6_K && super::dot::has_vnni()
}

/// Sixteen Q6_K rows repacked: for each super-block its 32 `ql` and 16 `qh` words with lane
/// `j` of each 64-byte register row `j`'s, its 16 scales per row, its `d` as the f16 stored.
#[derive(Debug, Clone, Default)]
pub(super) struct Q6kTile {
    blocks: usize,
    /// `[blocks, 48 words (ql then qh), 16 rows, 4 bytes]`.
    values: Vec<u8>,
    /// `[blocks, 16 half-blocks, 16 rows]`, signed.
    scales: Vec<i8>,
    /// `[blocks, 16 rows]`, f16 as stored.
    d: Vec<u16>,
}

/// Where half-block `hb`'s four words lie in a super-block: its first `ql` word, whether it
/// takes their high nibbles, its first `qh` word and the shift of its bit pair. Values
/// `128·n + 32·g + l` are nibble `g / 2` of `ql[64·n + 32·(g % 2) + l]` and bits `2·g` of
/// `qh[32·n + l]`.
fn place(hb: usize) -> (usize, bool, usize, i32) {
    let (n, g, l0) = (hb / 8, (hb % 8) / 2, 16 * (hb % 2));
    (
        (64 * n + 32 * (g % 2) + l0) / 4,
        g >= 2,
        (32 * n + l0) / 4,
        2 * g as i32,
    )
}

impl Q6kTile {
    /// Repacks the 16 rows `data` (`16 × row_bytes`, whole super-blocks) into the tile.
    pub(super) fn fill(&mut self, data: &[u8], row_bytes: usize) {
        let blocks = row_bytes / BLOCK;
        assert!(data.len() >= ROWS * row_bytes && blocks * BLOCK == row_bytes);
        self.blocks = blocks;
        self.values.resize(blocks * STRIDE, 0);
        self.scales.resize(blocks * 16 * ROWS, 0);
        self.d.resize(blocks * ROWS, 0);
        for j in 0..ROWS {
            let row = &data[j * row_bytes..][..row_bytes];
            for (b, block) in row.chunks_exact(BLOCK).enumerate() {
                let dst = &mut self.values[b * STRIDE..][..STRIDE];
                for (w, word) in block[..192].chunks_exact(4).enumerate() {
                    dst[w * 64 + j * 4..][..4].copy_from_slice(word);
                }
                for (h, &s) in block[192..208].iter().enumerate() {
                    self.scales[(b * 16 + h) * ROWS + j] = s as i8;
                }
                self.d[b * ROWS + j] = u16::from_le_bytes([block[208], block[209]]);
            }
        }
    }

    /// Bytes the tile holds (its 16 rows').
    pub(super) fn bytes(&self) -> usize {
        self.values.len() + self.scales.len() + 2 * self.d.len()
    }

    /// Row `j` dequantized into `out` (`[blocks · 256]`): each super-block's stored bytes put
    /// back together (on the stack) and dequantized as the stored row would be.
    pub(super) fn row_f32(&self, j: usize, out: &mut [f32]) -> crate::error::Result<()> {
        let mut stored = [0u8; BLOCK];
        for (b, out) in out.chunks_exact_mut(QK_K).take(self.blocks).enumerate() {
            let block = &self.values[b * STRIDE..][..STRIDE];
            for w in 0..QL_WORDS + QH_WORDS {
                stored[4 * w..][..4].copy_from_slice(&block[w * 64 + j * 4..][..4]);
            }
            for h in 0..16 {
                stored[192 + h] = self.scales[(b * 16 + h) * ROWS + j] as u8;
            }
            stored[208..].copy_from_slice(&self.d[b * ROWS + j].to_le_bytes());
            crate::dtype::dequantize_into(DType::Q6_K, &stored, out, "row")?;
        }
        Ok(())
    }

    /// `out[r · tokens + t]` (`r` < 16) for every token `t` of `q8`, whose rows have the
    /// tile's width.
    pub(super) fn product(&self, q8: &Q8Rows, out: &mut [f32]) {
        let tokens = q8.q.len() / q8.cols.max(1);
        let cols = self.blocks * QK_K;
        assert!(out.len() >= ROWS * tokens && q8.cols == cols);
        assert!(self.values.len() >= self.blocks * STRIDE);
        assert!(self.scales.len() >= self.blocks * 16 * ROWS && self.d.len() >= self.blocks * ROWS);
        assert!(q8.d.len() >= tokens * cols / 16 && q8.isum.len() >= tokens * cols / 16);
        // SAFETY: a tile is made only where the CPU has VNNI (`available`); the lengths were
        // checked above.
        unsafe { in_fours(self, q8, tokens, out) };
    }

    /// The 16 rows' products with tokens `first..first + N` of `q8`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VNNI and F16C; `q8`'s rows are the tile's width and hold
    /// the tokens asked for; the tile is filled.
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
    unsafe fn pass<const N: usize>(&self, q8: &Q8Rows, first: usize) -> [[f32; ROWS]; N] {
        let cols = self.blocks * QK_K;
        let halves = cols / 16;
        let mut acc = [[_mm512_setzero_ps(); 4]; N];
        let (low4, low2) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(3));
        for b in 0..self.blocks {
            // SAFETY (every access of this block): super-block `b` lies inside the tile's
            // vectors and each token's values, scales and sums (the caller's promise, the
            // lengths asserted by `product`).
            unsafe {
                let p = self.values.as_ptr().add(b * STRIDE);
                for l in 0..STRIDE / 64 {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH * STRIDE + l * 64).cast());
                }
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(self.d.as_ptr().add(b * ROWS).cast()));
                let word = |w: usize| _mm512_loadu_si512(p.add(w * 64).cast());
                for hb in 0..16 {
                    let (ql, high, qh, shift) = place(hb);
                    let shift = _mm_cvtsi32_si128(shift);
                    // value + 32: the nibble, and the bit pair above it
                    let w: [__m512i; 4] = std::array::from_fn(|i| {
                        let nibbles = word(ql + i);
                        let nibbles = if high {
                            _mm512_srli_epi16::<4>(nibbles)
                        } else {
                            nibbles
                        };
                        let bits = _mm512_and_si512(
                            _mm512_srl_epi16(word(QL_WORDS + qh + i), shift),
                            low2,
                        );
                        _mm512_or_si512(
                            _mm512_and_si512(nibbles, low4),
                            _mm512_slli_epi16::<4>(bits),
                        )
                    });
                    let sc = _mm_loadu_si128(self.scales.as_ptr().add((b * 16 + hb) * ROWS).cast());
                    let scale = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
                    for (t, acc) in acc.iter_mut().enumerate() {
                        let h = (first + t) * halves + b * 16 + hb;
                        let qp = q8.q.as_ptr().add((first + t) * cols + b * QK_K + 16 * hb);
                        // the unsigned values' sum less 32 · Σ q: the signed values' sum
                        let mut sum = _mm512_set1_epi32(-32 * *q8.isum.as_ptr().add(h));
                        for (i, w) in w.iter().enumerate() {
                            let a = _mm512_set1_epi32(qp.add(4 * i).cast::<i32>().read_unaligned());
                            sum = _mm512_dpbusd_epi32(sum, *w, a);
                        }
                        let c = _mm512_mul_ps(scale, _mm512_set1_ps(*q8.d.as_ptr().add(h)));
                        let slot = &mut acc[hb % 4];
                        *slot = _mm512_add_ps(*slot, _mm512_mul_ps(_mm512_cvtepi32_ps(sum), c));
                    }
                }
            }
        }
        let mut out = [[0.0f32; ROWS]; N];
        for (o, acc) in out.iter_mut().zip(&acc) {
            let dot = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
            // SAFETY: a 64-byte store into 16 f32.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), dot) };
        }
        out
    }
}

impl Pass for Q6kTile {
    unsafe fn tokens<const N: usize>(&self, q8: &Q8Rows, first: usize) -> [[f32; ROWS]; N] {
        // SAFETY: the caller's promise.
        unsafe { self.pass::<N>(q8, first) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_match_the_unpacked_rows_bit_for_bit() {
        if !available(DType::Q6_K) {
            eprintln!("no Q6_K tiles on this CPU");
            return;
        }
        super::super::tiles_k::tests::check_tiles(
            DType::Q6_K,
            BLOCK,
            Q6kTile::fill,
            Q6kTile::product,
            Q6kTile::row_f32,
        );
    }
}
