//! The 32-value types' matrix product (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) on AVX-512 VNNI, in tiles of 16
//! weight rows × up to 4 tokens: a decode step's one token, a prompt chunk, a batched or
//! speculative step.
//!
//! The row-at-a-time path ([`super::fused`]) meets each token with each row alone, so every
//! 64 values end in a horizontal sum (a transpose of four registers) and a 128-bit chain of
//! additions: most of its instructions are not the dot product. Here the 16 rows of a tile are
//! repacked so that one 512-bit register holds the same four values of each row (lane `j` is
//! row `j`); a token's four activation bytes are broadcast to every lane and one `vpdpbusd`
//! adds four products to each row's sum. A half-block of 16 values is four of them, already
//! summed per row, with nothing to reduce; its scale and the token's are then applied to the
//! 16 rows at once. Each block's values are unpacked once for up to four tokens and each
//! token's bytes are read once for 16 rows.
//!
//! The bits are those of the row path: the same exact integer sums per half-block (the
//! unsigned-weights correction `− 8·Σq`, `− 16·Σq` or `− 128·Σq` starts the sum), the same f32 products
//! `f32(Σ) · (scale · d)`, added to four accumulators by half-block index modulo four in the
//! order of the half-blocks, summed as `(a0 + a1) + (a2 + a3)`; Q4_1's and Q5_1's offsets as
//! [`super::dot::dot_f32`] adds them (eight lanes by block, then the rest). The tests hold
//! the tiles to the row path bit for bit.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::quant::{Layout, Q8Rows, QK, TILE_ROWS as ROWS};
use crate::dtype::DType;

/// Tokens per tile (their accumulators, four each, stay in registers beside a half-block's
/// four registers of values).
const TOKENS: usize = 4;

/// Blocks ahead of the one multiplied whose values are prefetched (one decode step of the
/// Llama-3.2-1B shape on the 2-core AMD EPYC: 36–37 tok/s without, 39–40 at 2 and 4 blocks,
/// 42–45 at 8, 44–46 at 16).
const PREFETCH: usize = 16;

/// Tokens a product needs before repacking its rows pays (fewer: the row path).
pub(super) const MIN_TOKENS: usize = 4;

/// The types the tiles cover.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
}

impl Kind {
    fn of(dtype: DType) -> Option<Self> {
        match dtype {
            DType::Q8_0 => Some(Kind::Q8_0),
            DType::Q4_0 => Some(Kind::Q4_0),
            DType::Q4_1 => Some(Kind::Q4_1),
            DType::Q5_0 => Some(Kind::Q5_0),
            DType::Q5_1 => Some(Kind::Q5_1),
            _ => None,
        }
    }

    /// The type itself.
    fn dtype(self) -> DType {
        match self {
            Kind::Q8_0 => DType::Q8_0,
            Kind::Q4_0 => DType::Q4_0,
            Kind::Q4_1 => DType::Q4_1,
            Kind::Q5_0 => DType::Q5_0,
            Kind::Q5_1 => DType::Q5_1,
        }
    }

    /// 4-byte words of values per stored block (one register of them per tile): the bytes,
    /// or the nibbles (the Q5 types' fifth bits are kept apart).
    fn words(self) -> usize {
        match self {
            Kind::Q8_0 => 8,
            _ => 4,
        }
    }

    /// What the unsigned weights' sum over a half-block is corrected by, times `Σ q`.
    fn correction(self) -> i32 {
        match self {
            Kind::Q8_0 => 128,
            Kind::Q4_0 => 8,
            Kind::Q5_0 => 16,
            Kind::Q4_1 | Kind::Q5_1 => 0,
        }
    }

    /// Whether blocks have an offset (`x = d·w + m`).
    fn offset(self) -> bool {
        matches!(self, Kind::Q4_1 | Kind::Q5_1)
    }

    /// Whether values have a fifth bit, kept in a word per block and row.
    fn fifth_bits(self) -> bool {
        matches!(self, Kind::Q5_0 | Kind::Q5_1)
    }
}

/// The kernels' const parameter for each [`Kind`].
const Q8_0: u8 = 0;
const Q4_0: u8 = 1;
const Q4_1: u8 = 2;
const Q5_0: u8 = 3;
const Q5_1: u8 = 4;

/// What starts each half-block's integer sum for the unsigned weights of `dtype`: `−c · Σq`
/// per token and half-block (`c` 128 for Q8_0, 8 for Q4_0, 16 for Q5_0), `[tokens, cols /
/// 16]`; empty for Q4_1 and Q5_1, whose stored values are their values.
pub(super) fn corrections(dtype: DType, q8: &Q8Rows) -> Vec<i32> {
    match Kind::of(dtype) {
        Some(k) if k.correction() != 0 => q8.isum.iter().map(|&s| -k.correction() * s).collect(),
        _ => Vec::new(),
    }
}

/// Whether [`Tile`] computes products of `dtype` on this CPU.
pub(super) fn available(dtype: DType) -> bool {
    Kind::of(dtype).is_some() && super::dot::has_vnni()
}

/// Sixteen weight rows repacked for the tiles: for each block, its words of values with
/// lane `j` of each 64-byte register row `j`'s (Q8_0's bytes as `w + 128`, unsigned), each
/// row's scale (and Q4_1's and Q5_1's offset) as the f16 stored, and the Q5 types' words of
/// fifth bits as stored; as many bytes as the rows'.
#[derive(Debug, Clone)]
pub(super) struct Tile {
    kind: Kind,
    /// The stored blocks' layout (size, where the values start).
    layout: Layout,
    blocks: usize,
    /// `[blocks, words, 16 rows, 4 bytes]`.
    values: Vec<u8>,
    /// `[blocks, 16 rows]`, f16 as stored.
    scales: Vec<u16>,
    /// `[blocks, 16 rows]`, f16 as stored (Q4_1 and Q5_1 only).
    offsets: Vec<u16>,
    /// `[blocks, 16 rows]`: bit `v` is value `v`'s fifth bit, as stored (Q5_0 and Q5_1 only).
    high: Vec<u32>,
}

impl Tile {
    /// An empty tile for `dtype`; `None` for types the tiles do not cover.
    pub(super) fn new(dtype: DType) -> Option<Self> {
        Some(Self {
            kind: Kind::of(dtype)?,
            layout: super::quant::layout(dtype)?,
            blocks: 0,
            values: Vec::new(),
            scales: Vec::new(),
            offsets: Vec::new(),
            high: Vec::new(),
        })
    }

    /// Repacks the 16 rows `data` (`16 × row_bytes`, whole blocks) into the tile.
    pub(super) fn fill(&mut self, data: &[u8], row_bytes: usize) {
        let k = self.kind;
        let size = self.layout.size;
        let blocks = row_bytes / size;
        let stride = k.words() * 64;
        self.blocks = blocks;
        self.values.resize(blocks * stride, 0);
        self.scales.resize(blocks * ROWS, 0);
        if k.offset() {
            self.offsets.resize(blocks * ROWS, 0);
        }
        if k.fifth_bits() {
            self.high.resize(blocks * ROWS, 0);
        }
        assert!(data.len() >= ROWS * row_bytes && blocks * size == row_bytes);
        // SAFETY: the CPU has AVX-512 (a tile is made only where it does); `data` holds the
        // 16 rows and the tile was sized for them above.
        unsafe { self.transpose(data, row_bytes) };
    }

    /// [`Self::fill`]'s repacking: for each block, the 16 rows' 16-byte runs of values
    /// loaded four rows to a register and transposed (4 × 4 words inside each 128-bit lane,
    /// then the lanes put in row order), the f16 scales (and offsets) copied as stored.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and F16C; `data` holds 16 rows of `row_bytes` (whole blocks)
    /// and the tile is sized for them.
    #[target_feature(enable = "avx2,f16c,avx512f")]
    unsafe fn transpose(&mut self, data: &[u8], row_bytes: usize) {
        let k = self.kind;
        let (size, stride, at) = (self.layout.size, k.words() * 64, self.layout.values);
        let flip = _mm512_set1_epi32(if k == Kind::Q8_0 {
            0x8080_8080u32 as i32
        } else {
            0
        });
        // lane j = 4i + m from lane 4m + i
        let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        let base = data.as_ptr();
        for b in 0..self.blocks {
            // SAFETY: every read lies in block `b` of one of the 16 rows of `data`, every
            // write in block `b`'s part of the tile (the caller's promise).
            unsafe {
                let block = |j: usize| base.add(j * row_bytes + b * size);
                let dst = self.values.as_mut_ptr().add(b * stride);
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
                let b16 = b * ROWS;
                for j in 0..ROWS {
                    let p = block(j);
                    self.scales[b16 + j] = u16::from_le_bytes([*p, *p.add(1)]);
                    if k.offset() {
                        self.offsets[b16 + j] = u16::from_le_bytes([*p.add(2), *p.add(3)]);
                    }
                    if let Some(at) = self.layout.high_bits {
                        self.high[b16 + j] = p.add(at).cast::<u32>().read_unaligned();
                    }
                }
            }
        }
    }

    /// Bytes the tile holds (those of its 16 rows as stored).
    pub(super) fn bytes(&self) -> usize {
        self.values.len() + 2 * (self.scales.len() + self.offsets.len()) + 4 * self.high.len()
    }

    /// Row `j` dequantized into `out` (`[blocks · 32]`): each block's stored bytes put back
    /// together from the tile (on the stack) and dequantized as the stored row would be, for
    /// what reads a row by itself (an embedding lookup).
    pub(super) fn row_f32(&self, j: usize, out: &mut [f32]) -> crate::error::Result<()> {
        let (k, l) = (self.kind, self.layout);
        let (stride, flip) = (k.words() * 64, if k == Kind::Q8_0 { 0x80 } else { 0 });
        let mut stored = [0u8; 64];
        for (b, out) in out.chunks_exact_mut(QK).take(self.blocks).enumerate() {
            stored[..2].copy_from_slice(&self.scales[b * ROWS + j].to_le_bytes());
            if k.offset() {
                stored[2..4].copy_from_slice(&self.offsets[b * ROWS + j].to_le_bytes());
            }
            if let Some(at) = l.high_bits {
                stored[at..at + 4].copy_from_slice(&self.high[b * ROWS + j].to_le_bytes());
            }
            let block = &self.values[b * stride..][..stride];
            for w in 0..k.words() {
                let word = &block[w * 64 + j * 4..][..4];
                for (s, &v) in stored[l.values + 4 * w..][..4].iter_mut().zip(word) {
                    *s = v ^ flip;
                }
            }
            crate::dtype::dequantize_into(k.dtype(), &stored[..l.size], out, "row")?;
        }
        Ok(())
    }

    /// `out[r · tokens + t]` (`r` < 16) for every token `t` of `q8`, whose rows have the
    /// tile's width; `corrections` is [`corrections`]' for `q8` and this tile's type.
    pub(super) fn product(&self, q8: &Q8Rows, corrections: &[i32], out: &mut [f32]) {
        let tokens = q8.q.len() / q8.cols.max(1);
        let halves = self.blocks * 2;
        assert!(out.len() >= ROWS * tokens && q8.cols == self.blocks * QK);
        assert!(self.values.len() >= self.blocks * self.kind.words() * 64);
        assert!(self.scales.len() >= self.blocks * ROWS);
        assert!(!self.kind.offset() || self.offsets.len() >= self.blocks * ROWS);
        assert!(!self.kind.fifth_bits() || self.high.len() >= self.blocks * ROWS);
        assert!(self.kind.correction() == 0 || corrections.len() >= tokens * halves);
        assert!(q8.d.len() >= tokens * halves && q8.s.len() >= tokens * self.blocks);
        let mut first = 0;
        while first < tokens {
            let n = (tokens - first).min(TOKENS);
            let corr = corrections.get(first * halves..).unwrap_or(&[]);
            // SAFETY: `available` was checked by whoever made the tile (it is made only
            // where the CPU has VNNI); the lengths were checked above.
            let sums = unsafe {
                match (self.kind, n) {
                    (Kind::Q8_0, 1) => widen(self.tokens::<Q8_0, 1>(q8, corr, first)),
                    (Kind::Q8_0, 2) => widen(self.tokens::<Q8_0, 2>(q8, corr, first)),
                    (Kind::Q8_0, 3) => widen(self.tokens::<Q8_0, 3>(q8, corr, first)),
                    (Kind::Q8_0, _) => self.tokens::<Q8_0, TOKENS>(q8, corr, first),
                    (Kind::Q4_0, 1) => widen(self.tokens::<Q4_0, 1>(q8, corr, first)),
                    (Kind::Q4_0, 2) => widen(self.tokens::<Q4_0, 2>(q8, corr, first)),
                    (Kind::Q4_0, 3) => widen(self.tokens::<Q4_0, 3>(q8, corr, first)),
                    (Kind::Q4_0, _) => self.tokens::<Q4_0, TOKENS>(q8, corr, first),
                    (Kind::Q4_1, 1) => widen(self.tokens::<Q4_1, 1>(q8, corr, first)),
                    (Kind::Q4_1, 2) => widen(self.tokens::<Q4_1, 2>(q8, corr, first)),
                    (Kind::Q4_1, 3) => widen(self.tokens::<Q4_1, 3>(q8, corr, first)),
                    (Kind::Q4_1, _) => self.tokens::<Q4_1, TOKENS>(q8, corr, first),
                    (Kind::Q5_0, 1) => widen(self.tokens::<Q5_0, 1>(q8, corr, first)),
                    (Kind::Q5_0, 2) => widen(self.tokens::<Q5_0, 2>(q8, corr, first)),
                    (Kind::Q5_0, 3) => widen(self.tokens::<Q5_0, 3>(q8, corr, first)),
                    (Kind::Q5_0, _) => self.tokens::<Q5_0, TOKENS>(q8, corr, first),
                    (Kind::Q5_1, 1) => widen(self.tokens::<Q5_1, 1>(q8, corr, first)),
                    (Kind::Q5_1, 2) => widen(self.tokens::<Q5_1, 2>(q8, corr, first)),
                    (Kind::Q5_1, 3) => widen(self.tokens::<Q5_1, 3>(q8, corr, first)),
                    (Kind::Q5_1, _) => self.tokens::<Q5_1, TOKENS>(q8, corr, first),
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

    /// The 16 rows' products with tokens `first..first + N` of `q8`, for the type `K`
    /// (the tile's); `corr` holds the tokens' corrections from `first` on.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VNNI; `q8`'s rows are `blocks` blocks wide and hold the
    /// tokens asked for, and `corr` theirs (unless `K` has no correction); the tile is filled.
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
    unsafe fn tokens<const K: u8, const N: usize>(
        &self,
        q8: &Q8Rows,
        corr: &[i32],
        first: usize,
    ) -> [[f32; ROWS]; N] {
        let halves = 2 * self.blocks;
        let cols = self.blocks * QK;
        // SAFETY (of every access below): each token's values, scales and corrections are
        // `cols`, `halves` and `halves` long from these bases, inside `q8` and `corr` (the
        // caller's promise); the tile holds `blocks` blocks of values and scales.
        let (q, d, c) = unsafe {
            (
                q8.q.as_ptr().add(first * cols),
                q8.d.as_ptr().add(first * halves),
                corr.as_ptr(),
            )
        };
        let at = At {
            q,
            d,
            c,
            cols,
            halves,
        };
        let mut acc = [[_mm512_setzero_ps(); 4]; N];
        for p in 0..self.blocks / 2 {
            // SAFETY: blocks 2p and 2p + 1 lie inside the tile and the tokens' rows.
            unsafe {
                self.block::<K, N, 0>(at, 2 * p, &mut acc);
                self.block::<K, N, 2>(at, 2 * p + 1, &mut acc);
            }
        }
        if self.blocks % 2 == 1 {
            // SAFETY: as above, for the last block.
            unsafe { self.block::<K, N, 0>(at, self.blocks - 1, &mut acc) };
        }
        let mut out = [[0.0f32; ROWS]; N];
        for (t, (o, acc)) in out.iter_mut().zip(&acc).enumerate() {
            let mut dot =
                _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
            if K == Q4_1 || K == Q5_1 {
                let (_, _, s) = q8.row(first + t);
                // SAFETY: the offsets and the block sums cover `blocks` blocks.
                dot = _mm512_add_ps(dot, unsafe { self.offset_dot(s) });
            }
            // SAFETY: a 64-byte store into 16 f32.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), dot) };
        }
        out
    }

    /// Block `b` with `N` tokens: each half-block's 16 row sums, scaled, added to the
    /// accumulators `A` and `A + 1` (half-block index modulo four: 0 and 1 for even blocks,
    /// 2 and 3 for odd ones).
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VNNI; block `b` lies inside the tile and inside each
    /// token's values, scales and corrections at `at`.
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn block<const K: u8, const N: usize, const A: usize>(
        &self,
        at: At,
        b: usize,
        acc: &mut [[__m512; 4]; N],
    ) {
        let stride = if K == Q8_0 { 8 * 64 } else { 4 * 64 };
        let h = 2 * b;
        // SAFETY: the caller's promise.
        unsafe {
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(
                self.scales.as_ptr().add(b * ROWS).cast(),
            ));
            let p = self.values.as_ptr().add(b * stride);
            // the block PREFETCH blocks on asked for now: a decode step streams the tiles
            // from memory, each tile a run of its own that the hardware's prefetch meets late
            for l in 0..stride / 64 {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH * stride + l * 64).cast());
            }
            let mask = _mm512_set1_epi8(0x0F);
            let fifth = K == Q5_0 || K == Q5_1;
            // the 16 rows' words of fifth bits (lane j: row j's)
            let high = match fifth {
                true => _mm512_loadu_si512(self.high.as_ptr().add(b * ROWS).cast()),
                false => _mm512_setzero_si512(),
            };
            for half in 0..2 {
                let w: [__m512i; 4] = std::array::from_fn(|i| {
                    if K == Q8_0 {
                        _mm512_loadu_si512(p.add((4 * half + i) * 64).cast())
                    } else {
                        let v = _mm512_loadu_si512(p.add(i * 64).cast());
                        let v = if half == 0 {
                            v
                        } else {
                            _mm512_srli_epi16::<4>(v)
                        };
                        let v = _mm512_and_si512(v, mask);
                        match fifth {
                            true => _mm512_or_si512(v, fifth_bits(high, 16 * half + 4 * i)),
                            false => v,
                        }
                    }
                });
                for (t, acc) in acc.iter_mut().enumerate() {
                    let hh = t * at.halves + h + half;
                    let mut sum = if K == Q4_1 || K == Q5_1 {
                        _mm512_setzero_si512()
                    } else {
                        _mm512_set1_epi32(*at.c.add(hh))
                    };
                    let qp = at.q.add(t * at.cols + b * QK + 16 * half);
                    for (i, w) in w.iter().enumerate() {
                        let word = _mm512_set1_epi32(qp.add(4 * i).cast::<i32>().read_unaligned());
                        sum = _mm512_dpbusd_epi32(sum, *w, word);
                    }
                    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*at.d.add(hh)));
                    let slot = &mut acc[A + half];
                    *slot = _mm512_add_ps(*slot, _mm512_mul_ps(_mm512_cvtepi32_ps(sum), scale));
                }
            }
        }
    }

    /// Q4_1's and Q5_1's `Σ_blocks offset · s` for the 16 rows with one token's block sums `s`, added as
    /// `dot_f32` adds them: eight lanes by block index, summed in order, then the blocks past
    /// the last eight.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; `offsets` and `s` cover `blocks` blocks.
    #[target_feature(enable = "avx2,f16c,avx512f")]
    unsafe fn offset_dot(&self, s: &[f32]) -> __m512 {
        let full = self.blocks / 8 * 8;
        // SAFETY: every load reads 16 offsets of a block inside `offsets`.
        let m = |b: usize| unsafe {
            _mm512_cvtph_ps(_mm256_loadu_si256(
                self.offsets.as_ptr().add(b * ROWS).cast(),
            ))
        };
        let mut lanes = [_mm512_setzero_ps(); 8];
        for c in (0..full).step_by(8) {
            for (i, lane) in lanes.iter_mut().enumerate() {
                *lane = _mm512_add_ps(*lane, _mm512_mul_ps(m(c + i), _mm512_set1_ps(s[c + i])));
            }
        }
        let mut total = _mm512_set1_ps(-0.0);
        for lane in lanes {
            total = _mm512_add_ps(total, lane);
        }
        let mut tail = _mm512_set1_ps(-0.0);
        for (b, &sb) in s.iter().enumerate().take(self.blocks).skip(full) {
            tail = _mm512_add_ps(tail, _mm512_mul_ps(m(b), _mm512_set1_ps(sb)));
        }
        _mm512_add_ps(total, tail)
    }
}

/// Where the tokens of a tile start: values, half-block scales and corrections, and their
/// lengths per token.
#[derive(Clone, Copy)]
struct At {
    q: *const i8,
    d: *const f32,
    c: *const i32,
    cols: usize,
    halves: usize,
}

/// For each row (lane), the fifth bits of its values `first..first + 4` (bits `first..` of its
/// word in `high`) as `0x10` in the four bytes that hold those values' nibbles, else 0.
#[target_feature(enable = "avx512f")]
#[inline]
fn fifth_bits(high: __m512i, first: usize) -> __m512i {
    let four = _mm512_and_si512(
        _mm512_srl_epi32(high, _mm_cvtsi32_si128(first as i32)),
        _mm512_set1_epi32(0xF),
    );
    // bit b moves to bit 8b (the four shifted copies, 7 bits apart, never carry into
    // each other), then to bit 4 of byte b
    let spread = _mm512_and_si512(
        _mm512_mullo_epi32(four, _mm512_set1_epi32(0x0020_4081)),
        _mm512_set1_epi32(0x0101_0101),
    );
    _mm512_slli_epi32::<4>(spread)
}

/// `N` tokens' sums in the first `N` of four slots.
fn widen<const N: usize>(a: [[f32; ROWS]; N]) -> [[f32; ROWS]; TOKENS] {
    std::array::from_fn(|k| a.get(k).copied().unwrap_or([0.0; ROWS]))
}

#[cfg(test)]
#[path = "tiles_vnni_tests.rs"]
mod tests;
