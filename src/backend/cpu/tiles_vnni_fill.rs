//! Repacking stored rows of the 32-value types into a tile's bytes ([`super::Tile`]'s
//! records: a pair of blocks' values transposed so that lane `j` of a line is row `j`'s, then
//! their scales, offsets and fifth bits).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{pair_lines, place, Kind, Layout, Place, ROWS};

/// What repacks 16 rows of one type and width into a tile's bytes ([`Tile::filler`]).
#[derive(Clone, Copy)]
pub(in crate::backend::cpu) struct Filler {
    pub(super) kind: Kind,
    pub(super) layout: Layout,
    pub(super) blocks: usize,
    pub(super) row_bytes: usize,
}

impl Filler {
    /// Repacks the 16 rows at the start of `data` into `tile` (a tile's bytes).
    pub(in crate::backend::cpu) fn fill(&self, tile: &mut [u8], data: &[u8]) {
        let pair = pair_lines(self.kind.code()) * 64;
        assert!(data.len() >= ROWS * self.row_bytes);
        assert_eq!(tile.len(), self.blocks.div_ceil(2) * pair);
        // SAFETY: `data` holds the 16 rows and `tile` was sized for them (asserted above);
        // the AVX-512 transpose runs only where the CPU has it (SSE2 is x86_64's baseline).
        #[cfg(target_arch = "x86_64")]
        unsafe {
            match crate::backend::cpu::dot::has_vnni() {
                true => self.transpose(tile, data),
                false => self.transpose_sse2(tile, data),
            }
        }
        // SAFETY: as above (the build has SIMD128).
        #[cfg(target_arch = "wasm32")]
        unsafe {
            self.transpose_simd128(tile, data)
        }
    }

    /// The 16 rows' values of every block, four rows' 16-byte runs at a time: `four(from,
    /// to)` loads 16 bytes at each of the four `from` (rows `4i..4i + 4`), transposes them as
    /// 4 × 4 words (word `w` of every row together), flips Q8_0's sign bits and stores word
    /// `w`'s four rows at `to[w]` (a quarter of a line); then the block's scalars.
    ///
    /// # Safety
    /// `data` holds 16 rows of `row_bytes` (whole blocks), `tile` is sized for them, and
    /// `four` reads and writes only the 16 bytes at each pointer it is given.
    #[inline(always)]
    unsafe fn by_fours(
        &self,
        tile: &mut [u8],
        data: &[u8],
        four: impl Fn([*const u8; 4], [*mut u8; 4]),
    ) {
        let (k, row_bytes) = (self.kind, self.row_bytes);
        let (size, at) = (self.layout.size, self.layout.values);
        let pair = pair_lines(k.code()) * 64;
        let base = data.as_ptr();
        for b in 0..self.blocks {
            let place = place(k.code(), b % 2);
            // SAFETY: every read lies in block `b` of one of the 16 rows of `data`, every
            // write in block `b`'s part of its pair's record (the caller's promise).
            unsafe {
                let block = |j: usize| base.add(j * row_bytes + b * size);
                let rec = tile.as_mut_ptr().add(b / 2 * pair);
                let dst = rec.add(place.values);
                for run in 0..k.words() / 4 {
                    for i in 0..ROWS / 4 {
                        let from = std::array::from_fn(|m| block(4 * i + m).add(at + 16 * run));
                        let to = std::array::from_fn(|w| dst.add((4 * run + w) * 64 + 16 * i));
                        four(from, to);
                    }
                }
                self.scalars(block, rec, place);
            }
        }
    }

    /// The SSE2 transpose (`transpose_sse2`) in WebAssembly SIMD128: the same shuffles, the
    /// same bytes.
    ///
    /// # Safety
    /// `data` holds 16 rows of `row_bytes` (whole blocks) and `tile` is sized for them.
    #[cfg(target_arch = "wasm32")]
    unsafe fn transpose_simd128(&self, tile: &mut [u8], data: &[u8]) {
        use std::arch::wasm32::*;
        let flip = u8x16_splat(if self.kind == Kind::Q8_0 { 0x80 } else { 0 });
        // SAFETY: the caller's promise; each pointer is read or written 16 bytes.
        let four = |from: [*const u8; 4], to: [*mut u8; 4]| unsafe {
            let x = from.map(|p| v128_load(p.cast()));
            let t0 = i32x4_shuffle::<0, 4, 1, 5>(x[0], x[1]);
            let t1 = i32x4_shuffle::<2, 6, 3, 7>(x[0], x[1]);
            let t2 = i32x4_shuffle::<0, 4, 1, 5>(x[2], x[3]);
            let t3 = i32x4_shuffle::<2, 6, 3, 7>(x[2], x[3]);
            let words = [
                i64x2_shuffle::<0, 2>(t0, t2),
                i64x2_shuffle::<1, 3>(t0, t2),
                i64x2_shuffle::<0, 2>(t1, t3),
                i64x2_shuffle::<1, 3>(t1, t3),
            ];
            for (v, to) in words.into_iter().zip(to) {
                v128_store(to.cast(), v128_xor(v, flip));
            }
        };
        // SAFETY: the caller's promise.
        unsafe { self.by_fours(tile, data, four) }
    }

    /// [`Self::transpose`] with SSE2 (a CPU without AVX-512): each run of four words of four
    /// rows transposed in one register, written as a quarter of four lines. The same bytes.
    ///
    /// # Safety
    /// `data` holds 16 rows of `row_bytes` (whole blocks) and `tile` is sized for them.
    #[cfg(target_arch = "x86_64")]
    pub(super) unsafe fn transpose_sse2(&self, tile: &mut [u8], data: &[u8]) {
        let flip = _mm_set1_epi32(if self.kind == Kind::Q8_0 {
            0x8080_8080u32 as i32
        } else {
            0
        });
        // SAFETY: the caller's promise; each pointer is read or written 16 bytes (SSE2 is
        // x86_64's baseline).
        let four = |from: [*const u8; 4], to: [*mut u8; 4]| unsafe {
            let x = from.map(|p| _mm_loadu_si128(p.cast()));
            let t0 = _mm_unpacklo_epi32(x[0], x[1]);
            let t1 = _mm_unpackhi_epi32(x[0], x[1]);
            let t2 = _mm_unpacklo_epi32(x[2], x[3]);
            let t3 = _mm_unpackhi_epi32(x[2], x[3]);
            let words = [
                _mm_unpacklo_epi64(t0, t2),
                _mm_unpackhi_epi64(t0, t2),
                _mm_unpacklo_epi64(t1, t3),
                _mm_unpackhi_epi64(t1, t3),
            ];
            for (v, to) in words.into_iter().zip(to) {
                _mm_storeu_si128(to.cast(), _mm_xor_si128(v, flip));
            }
        };
        // SAFETY: the caller's promise.
        unsafe { self.by_fours(tile, data, four) }
    }

    /// Block `b`'s f16 scales (and offsets) and words of fifth bits of the 16 rows (`block(j)`
    /// is row `j`'s block) copied as stored into its pair's record `rec`.
    ///
    /// # Safety
    /// `block(j)` points at a whole stored block for each of the 16 rows, and `rec` at a
    /// record with room for `place`'s parts.
    unsafe fn scalars(&self, block: impl Fn(usize) -> *const u8, rec: *mut u8, place: Place) {
        for j in 0..ROWS {
            let p = block(j);
            // SAFETY: the caller's promise.
            unsafe {
                std::ptr::copy_nonoverlapping(p, rec.add(place.scales + 2 * j), 2);
                if self.kind.offset() {
                    std::ptr::copy_nonoverlapping(p.add(2), rec.add(place.offsets + 2 * j), 2);
                }
                if let Some(at) = self.layout.high_bits {
                    std::ptr::copy_nonoverlapping(p.add(at), rec.add(place.high + 4 * j), 4);
                }
            }
        }
    }

    /// [`Self::fill`]'s repacking: for each block, the 16 rows' 16-byte runs of values
    /// loaded four rows to a register and transposed (4 × 4 words inside each 128-bit lane,
    /// then the lanes put in row order), the f16 scales (and offsets) copied as stored.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and F16C; `data` holds 16 rows of `row_bytes` (whole blocks)
    /// and `tile` is sized for them.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c,avx512f")]
    unsafe fn transpose(&self, tile: &mut [u8], data: &[u8]) {
        let (k, row_bytes) = (self.kind, self.row_bytes);
        let (size, at) = (self.layout.size, self.layout.values);
        let pair = pair_lines(k.code()) * 64;
        let flip = _mm512_set1_epi32(if k == Kind::Q8_0 {
            0x8080_8080u32 as i32
        } else {
            0
        });
        // lane j = 4i + m from lane 4m + i
        let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        let base = data.as_ptr();
        for b in 0..self.blocks {
            let place = place(k.code(), b % 2);
            // SAFETY: every read lies in block `b` of one of the 16 rows of `data`, every
            // write in block `b`'s part of its pair's record (the caller's promise).
            unsafe {
                let block = |j: usize| base.add(j * row_bytes + b * size);
                let rec = tile.as_mut_ptr().add(b / 2 * pair);
                let dst = rec.add(place.values);
                for run in 0..k.words() / 4 {
                    let x = |j: usize| _mm_loadu_si128(block(j).add(at + 16 * run).cast());
                    let z: [__m512i; 4] = std::array::from_fn(|i| {
                        let lo = _mm256_set_m128i(x(4 * i + 1), x(4 * i));
                        let hi = _mm256_set_m128i(x(4 * i + 3), x(4 * i + 2));
                        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
                    });
                    let t0 = _mm512_unpacklo_epi32(z[0], z[1]);
                    let t1 = _mm512_unpackhi_epi32(z[0], z[1]);
                    let t2 = _mm512_unpacklo_epi32(z[2], z[3]);
                    let t3 = _mm512_unpackhi_epi32(z[2], z[3]);
                    let words = [
                        _mm512_unpacklo_epi64(t0, t2),
                        _mm512_unpackhi_epi64(t0, t2),
                        _mm512_unpacklo_epi64(t1, t3),
                        _mm512_unpackhi_epi64(t1, t3),
                    ];
                    for (w, v) in words.into_iter().enumerate() {
                        let v = _mm512_xor_si512(_mm512_permutexvar_epi32(order, v), flip);
                        _mm512_storeu_si512(dst.add((4 * run + w) * 64).cast(), v);
                    }
                }
                self.scalars(block, rec, place);
            }
        }
    }
}
