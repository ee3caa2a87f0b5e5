//! Q6_K's tiles on AVX2 with F16C (see [`super::super::tiles_k`]'s AVX2 passes): a
//! half-block's four words of `value + 32` (below 64) multiplied in two pairs, each pair's
//! 16-bit sums (four products of at most 63 · 128 a lane) made 32-bit, the sum started at
//! `−32 · Σ q`. The same bits as the VNNI pass.

use std::arch::x86_64::*;

use super::{place, Q6kTiles, D_LINE, LINES, PREFETCH, QK_K, QL_WORDS, SCALES_LINE};
use crate::backend::cpu::quant::{Q8Rows, TILE_ROWS as ROWS};
use crate::backend::cpu::tiles_k::avx2::{PartAvx2, LANES};

impl PartAvx2 for Q6kTiles {
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn part<const N: usize>(
        &self,
        g: usize,
        q8: &Q8Rows,
        first: usize,
        part: usize,
    ) -> [[f32; LANES]; N] {
        let blocks = self.0.blocks();
        let cols = blocks * QK_K;
        let halves = cols / 16;
        let tile = self.0.tile(g).as_ptr();
        let mut acc = [[_mm256_setzero_ps(); 4]; N];
        let (low4, low2) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3));
        let ones = _mm256_set1_epi16(1);
        for b in 0..blocks {
            // SAFETY (every access of this block): super-block `b` of tile `g` lies inside
            // the lines and each token's values, scales and sums (the caller's promise).
            unsafe {
                let p = tile.add(b * LINES * 64);
                if part == 0 {
                    // PREFETCH super-blocks on; the second pass reads what the first brought
                    let ahead = p.wrapping_add(PREFETCH * LINES * 64);
                    for l in 0..LINES {
                        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(l * 64).cast());
                    }
                }
                let d = p.add(D_LINE * 64 + 2 * LANES * part);
                let d = _mm256_cvtph_ps(_mm_loadu_si128(d.cast()));
                let word = |w: usize| _mm256_loadu_si256(p.add(w * 64 + 4 * LANES * part).cast());
                for hb in 0..16 {
                    let (ql, high, qh, shift) = place(hb);
                    let shift = _mm_cvtsi32_si128(shift);
                    // value + 32: the nibble, and the bit pair above it
                    let w: [__m256i; 4] = std::array::from_fn(|i| {
                        let nibbles = word(ql + i);
                        let nibbles = if high {
                            _mm256_srli_epi16::<4>(nibbles)
                        } else {
                            nibbles
                        };
                        let bits = _mm256_and_si256(
                            _mm256_srl_epi16(word(QL_WORDS + qh + i), shift),
                            low2,
                        );
                        _mm256_or_si256(
                            _mm256_and_si256(nibbles, low4),
                            _mm256_slli_epi16::<4>(bits),
                        )
                    });
                    let sc = p.add(SCALES_LINE * 64 + hb * ROWS + LANES * part);
                    let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(sc.cast()));
                    let scale = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
                    for (t, acc) in acc.iter_mut().enumerate() {
                        let h = (first + t) * halves + b * 16 + hb;
                        let qp = q8.q.as_ptr().add((first + t) * cols + b * QK_K + 16 * hb);
                        let m: [__m256i; 4] = std::array::from_fn(|i| {
                            let word = qp.add(4 * i).cast::<i32>().read_unaligned();
                            _mm256_maddubs_epi16(w[i], _mm256_set1_epi32(word))
                        });
                        // the unsigned values' sum less 32 · Σ q: the signed values' sum
                        let mut sum = _mm256_set1_epi32(-32 * *q8.isum.as_ptr().add(h));
                        for two in [(m[0], m[1]), (m[2], m[3])] {
                            let pairs = _mm256_add_epi16(two.0, two.1);
                            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, ones));
                        }
                        let c = _mm256_mul_ps(scale, _mm256_set1_ps(*q8.d.as_ptr().add(h)));
                        let slot = &mut acc[hb % 4];
                        *slot = _mm256_add_ps(*slot, _mm256_mul_ps(_mm256_cvtepi32_ps(sum), c));
                    }
                }
            }
        }
        let mut out = [[0.0f32; LANES]; N];
        for (o, acc) in out.iter_mut().zip(&acc) {
            let dot = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            // SAFETY: a 32-byte store into 8 f32.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), dot) };
        }
        out
    }
}
