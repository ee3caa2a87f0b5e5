//! The 32-value types' matrix product (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) in tiles of 16 weight
//! rows × up to 4 tokens, on AVX-512 VNNI (`avx512`), AVX2 with F16C (`avx2`) or, in a
//! WebAssembly build with relaxed SIMD, `i16x8.relaxed_dot_i8x16_i7x16_s` (`relaxed`): a decode
//! step's one token, a prompt chunk, a batched or speculative step. This module holds the
//! tiles' layout, their repacking (`fill`) and what reads them back.
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

#![cfg(any(
    target_arch = "x86_64",
    all(target_arch = "wasm32", target_feature = "relaxed-simd")
))]

use super::quant::{Layout, Q8Rows, QK, TILE_ROWS as ROWS};
use super::tile_lines::TileLines;
use crate::dtype::DType;

/// Pairs of blocks ahead of the pair multiplied whose lines are prefetched into L2 (13.5 KiB
/// ahead for Q4_0). Decode of the Llama-3.2-1B shape in Q4_0 on the 2-core AMD EPYC, 2
/// threads, alternating builds: 22–25 tok/s with no prefetch, 27–31 at 8 pairs, 30–32 at 24,
/// 28–32 at 48.
#[cfg(target_arch = "x86_64")]
const PREFETCH: usize = 24;

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

    /// What the unsigned weights' sum over a half-block is corrected by, times `Σ q`, on
    /// `isa` (0: no correction). Only VNNI multiplies Q8_0's values unsigned; AVX2 and relaxed
    /// SIMD take them in the signed form, which needs none.
    fn correction(self, isa: Option<Isa>) -> i32 {
        match self {
            Kind::Q8_0 if isa.is_some_and(Isa::unsigned_q8_0) => 128,
            Kind::Q8_0 => 0,
            Kind::Q4_0 => 8,
            Kind::Q5_0 => 16,
            Kind::Q4_1 | Kind::Q5_1 => 0,
        }
    }

    /// Whether blocks have an offset (`x = d·w + m`).
    fn offset(self) -> bool {
        matches!(self, Kind::Q4_1 | Kind::Q5_1)
    }

    /// The kernels' const parameter.
    fn code(self) -> u8 {
        match self {
            Kind::Q8_0 => Q8_0,
            Kind::Q4_0 => Q4_0,
            Kind::Q4_1 => Q4_1,
            Kind::Q5_0 => Q5_0,
            Kind::Q5_1 => Q5_1,
        }
    }
}

/// Where a block's parts lie in its pair's record (bytes from the record's start): a pair of
/// blocks is their words of values (block 2p's, then 2p + 1's), a line of the 16 rows'
/// scales (32 bytes each), one of offsets where the type has them, then one line of fifth
/// bits per block where it has them: as many bytes as the 16 rows' two blocks as stored.
#[derive(Clone, Copy)]
struct Place {
    values: usize,
    scales: usize,
    offsets: usize,
    high: usize,
}

/// Cache lines of a pair of blocks of type `k` (a [`Kind::code`]).
const fn pair_lines(k: u8) -> usize {
    let words = if k == Q8_0 { 8 } else { 4 };
    let offset = (k == Q4_1 || k == Q5_1) as usize;
    let fifth = (k == Q5_0 || k == Q5_1) as usize;
    2 * words + 1 + offset + 2 * fifth
}

/// Where block `2p + odd`'s parts lie in pair `p`'s record, for type `k`.
const fn place(k: u8, odd: usize) -> Place {
    let words = if k == Q8_0 { 8 } else { 4 };
    let offset = (k == Q4_1 || k == Q5_1) as usize;
    Place {
        values: odd * words * 64,
        scales: 2 * words * 64 + odd * 32,
        offsets: (2 * words + 1) * 64 + odd * 32,
        high: (2 * words + 1 + offset + odd) * 64,
    }
}

/// The kernels' const parameter for each [`Kind`].
const Q8_0: u8 = 0;
const Q4_0: u8 = 1;
const Q4_1: u8 = 2;
const Q5_0: u8 = 3;
const Q5_1: u8 = 4;

/// What starts each half-block's integer sum for the unsigned weights of `dtype` on this
/// CPU's tiles: `−c · Σq` per token and half-block (`c` 8 for Q4_0, 16 for Q5_0, 128 for Q8_0
/// on VNNI), `[tokens, cols / 16]`; empty where the kernel needs none (Q4_1 and Q5_1, whose
/// stored values are their values; Q8_0 in the signed form).
pub(super) fn corrections(dtype: DType, q8: &Q8Rows) -> Vec<i32> {
    match Kind::of(dtype).map(|k| k.correction(isa())) {
        Some(c) if c != 0 => q8.isum.iter().map(|&s| -c * s).collect(),
        _ => Vec::new(),
    }
}

/// The instructions a tile's product runs on (the same bits on each).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Isa {
    /// AVX-512 F, BW and VNNI: 16 rows to a register, `vpdpbusd` ([`avx512`]).
    #[cfg(target_arch = "x86_64")]
    Vnni,
    /// AVX2 and F16C: 8 rows to a register, `vpmaddubsw` ([`avx2`]).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// WebAssembly relaxed SIMD (a build for it): 4 rows to a register,
    /// `i16x8.relaxed_dot_i8x16_i7x16_s` ([`relaxed`]).
    #[cfg(target_arch = "wasm32")]
    Relaxed,
}

impl Isa {
    /// Whether the kernel multiplies Q8_0's values unsigned (`w + 128`, corrected by
    /// `128 · Σq`) rather than in the signed form.
    fn unsigned_q8_0(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        return self == Isa::Vnni;
        #[cfg(target_arch = "wasm32")]
        return false;
    }
}

/// The instructions this CPU runs tiles on, if any (asked once).
pub(super) fn isa() -> Option<Isa> {
    #[cfg(target_arch = "x86_64")]
    {
        if super::dot::has_vnni() {
            return Some(Isa::Vnni);
        }
        super::dot::has_avx2_f16c().then_some(Isa::Avx2)
    }
    #[cfg(target_arch = "wasm32")]
    Some(Isa::Relaxed)
}

/// Whether [`Tile`] computes products of `dtype` on this CPU.
pub(super) fn available(dtype: DType) -> bool {
    Kind::of(dtype).is_some() && isa().is_some()
}

/// Weight rows repacked for the tiles, 16 to a tile, every tile in one buffer of cache lines
/// ([`TileLines`]) as a record per pair of blocks ([`Place`]): each block's words of values
/// with lane `j` of each line row `j`'s (Q8_0's bytes as `w + 128`, unsigned), each row's
/// scale (and Q4_1's and Q5_1's offset) as the f16 stored, and the Q5 types' words of fifth
/// bits as stored; as many bytes as the rows' (a tile of an odd number of blocks: one block
/// more).
#[derive(Debug, Clone)]
pub(super) struct Tile {
    kind: Kind,
    /// What the products run on.
    isa: Isa,
    /// The stored blocks' layout (size, where the values start).
    layout: Layout,
    /// Blocks per row.
    blocks: usize,
    /// `[tiles, ⌈blocks / 2⌉ pairs, pair_lines]`.
    lines: TileLines,
}

impl Tile {
    /// An empty tile for `dtype`; `None` for types the tiles do not cover or where this CPU
    /// has no tiles.
    pub(super) fn new(dtype: DType) -> Option<Self> {
        Self::on(dtype, isa()?)
    }

    /// [`Self::new`] running on `isa`, which the caller checked this CPU has.
    pub(super) fn on(dtype: DType, isa: Isa) -> Option<Self> {
        Some(Self {
            kind: Kind::of(dtype)?,
            isa,
            layout: super::quant::layout(dtype)?,
            blocks: 0,
            lines: TileLines::default(),
        })
    }

    /// Room for `tiles` tiles of `dtype` rows of `row_bytes` (whole blocks), to be filled by
    /// [`Self::filler`] on each of [`Self::tiles_mut`]; `None` for types the tiles do not
    /// cover.
    pub(super) fn with_tiles(dtype: DType, tiles: usize, row_bytes: usize) -> Option<Self> {
        let mut t = Self::new(dtype)?;
        t.shape(tiles, row_bytes);
        Some(t)
    }

    /// Sized for `tiles` tiles of rows of `row_bytes` (the buffer kept where it is already).
    fn shape(&mut self, tiles: usize, row_bytes: usize) {
        let blocks = row_bytes / self.layout.size;
        assert_eq!(blocks * self.layout.size, row_bytes, "rows of whole blocks");
        self.blocks = blocks;
        self.lines
            .reshape(tiles, blocks.div_ceil(2), pair_lines(self.kind.code()));
    }

    /// Each tile's bytes, to be filled apart.
    pub(super) fn tiles_mut(&mut self) -> Vec<&mut [u8]> {
        self.lines.tiles_mut()
    }

    /// What fills a tile of this matrix from 16 stored rows of `row_bytes`.
    pub(super) fn filler(&self, row_bytes: usize) -> Filler {
        Filler {
            kind: self.kind,
            layout: self.layout,
            blocks: self.blocks,
            row_bytes,
        }
    }

    /// Repacks the 16 rows `data` (`16 × row_bytes`, whole blocks) into a tile of its own,
    /// the one this holds from then on.
    pub(super) fn fill(&mut self, data: &[u8], row_bytes: usize) {
        self.shape(1, row_bytes);
        let filler = self.filler(row_bytes);
        for tile in self.tiles_mut() {
            filler.fill(tile, data);
        }
    }
}

impl Tile {
    /// Bytes the tiles hold (those of their rows as stored, one block more per tile where a
    /// row's blocks are odd).
    pub(super) fn bytes(&self) -> usize {
        self.lines.bytes()
    }

    /// Row `r` dequantized into `out` (`[blocks · 32]`): each block's stored bytes put back
    /// together from its tile (on the stack) and dequantized as the stored row would be, for
    /// what reads a row by itself (an embedding lookup).
    pub(super) fn row_f32(&self, r: usize, out: &mut [f32]) -> crate::error::Result<()> {
        let (k, l) = (self.kind, self.layout);
        let (tile, j) = (self.lines.tile(r / ROWS), r % ROWS);
        let pair = pair_lines(k.code()) * 64;
        let flip = if k == Kind::Q8_0 { 0x80 } else { 0 };
        let mut stored = [0u8; 64];
        for (b, out) in out.chunks_exact_mut(QK).take(self.blocks).enumerate() {
            let place = place(k.code(), b % 2);
            let rec = &tile[b / 2 * pair..][..pair];
            stored[..2].copy_from_slice(&rec[place.scales + 2 * j..][..2]);
            if k.offset() {
                stored[2..4].copy_from_slice(&rec[place.offsets + 2 * j..][..2]);
            }
            if let Some(at) = l.high_bits {
                stored[at..at + 4].copy_from_slice(&rec[place.high + 4 * j..][..4]);
            }
            for w in 0..k.words() {
                let word = &rec[place.values + w * 64 + j * 4..][..4];
                for (s, &v) in stored[l.values + 4 * w..][..4].iter_mut().zip(word) {
                    *s = v ^ flip;
                }
            }
            crate::dtype::dequantize_into(k.dtype(), &stored[..l.size], out, "row")?;
        }
        Ok(())
    }

    /// `out[r · tokens + t]` (`r` < 16) for row `16·g + r` and every token `t` of `q8`, whose
    /// rows have the tiles' width; `corrections` is [`corrections`]' for `q8` and this type.
    pub(super) fn product(&self, g: usize, q8: &Q8Rows, corrections: &[i32], out: &mut [f32]) {
        let tokens = q8.q.len() / q8.cols.max(1);
        let halves = self.blocks * 2;
        assert!(out.len() >= ROWS * tokens && q8.cols == self.blocks * QK);
        let tile = self.lines.tile(g);
        let pair = pair_lines(self.kind.code()) * 64;
        assert_eq!(tile.len(), self.blocks.div_ceil(2) * pair);
        assert!(self.kind.correction(Some(self.isa)) == 0 || corrections.len() >= tokens * halves);
        assert!(q8.d.len() >= tokens * halves && q8.s.len() >= tokens * self.blocks);
        let tile = tile.as_ptr();
        #[cfg(target_arch = "x86_64")]
        match self.isa {
            // SAFETY: a tile is made on an ISA only where the CPU has it (AVX2 with F16C, or
            // AVX-512 F, BW and VNNI); the lengths were checked above.
            Isa::Avx2 => unsafe { self.product_avx2(tile, q8, corrections, out) },
            Isa::Vnni => unsafe { self.product_vnni(tile, q8, corrections, out) },
        }
        #[cfg(target_arch = "wasm32")]
        match self.isa {
            // SAFETY: the lengths were checked above.
            Isa::Relaxed => unsafe { self.product_relaxed(tile, q8, corrections, out) },
        }
    }
}

/// What Q4_1's and Q5_1's offsets add to a register of a tile's rows for one token:
/// `Σ_b m(b) · s[b]` over `blocks` blocks, `m(b)` block `b`'s offsets for the register's rows
/// and `s` the token's block sums, added as `dot_f32` adds them (eight lanes by block index,
/// summed in order, then the blocks past the last eight), so every kernel keeps the row
/// path's bits. `splat`, `add` and `mul` are the kernel's vector operations.
#[inline(always)]
pub(super) fn offset_sum<V: Copy>(
    blocks: usize,
    s: &[f32],
    m: impl Fn(usize) -> V,
    splat: impl Fn(f32) -> V,
    add: impl Fn(V, V) -> V,
    mul: impl Fn(V, V) -> V,
) -> V {
    let full = blocks / 8 * 8;
    let mut lanes = [splat(0.0); 8];
    for c in (0..full).step_by(8) {
        for (i, lane) in lanes.iter_mut().enumerate() {
            *lane = add(*lane, mul(m(c + i), splat(s[c + i])));
        }
    }
    let mut total = splat(-0.0);
    for lane in lanes {
        total = add(total, lane);
    }
    let mut tail = splat(-0.0);
    for (b, &sb) in s.iter().enumerate().take(blocks).skip(full) {
        tail = add(tail, mul(m(b), splat(sb)));
    }
    add(total, tail)
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

/// The loop every kernel runs over a tile's tokens: up to `T` at a time (the last group
/// fewer), and for each group the tile's `ROWS / L` passes of `L` rows; `pass(first, n, corr,
/// part)` gives rows `L·part..L·part + L` of tokens `first..first + n` (`corr`: the
/// corrections from token `first` on), placed at `out[r · tokens + t]`.
#[cfg(any(target_arch = "x86_64", target_arch = "wasm32"))]
#[inline(always)]
fn by_passes<const L: usize, const T: usize>(
    tokens: usize,
    halves: usize,
    corrections: &[i32],
    out: &mut [f32],
    mut pass: impl FnMut(usize, usize, &[i32], usize) -> [[f32; L]; T],
) {
    let mut first = 0;
    while first < tokens {
        let n = (tokens - first).min(T);
        let corr = corrections.get(first * halves..).unwrap_or(&[]);
        for part in 0..ROWS / L {
            let sums = pass(first, n, corr, part);
            for (k, row_sums) in sums.iter().take(n).enumerate() {
                for (r, &v) in row_sums.iter().enumerate() {
                    out[(L * part + r) * tokens + first + k] = v;
                }
            }
        }
        first += n;
    }
}

/// `[[f32; L]; T]` sums of `n` tokens for the tile's kind `kind`: `$call` with the const
/// `$k` bound to the kind's code and `$t` to the token count it is built for, the counts
/// listed in `[..]` each with its own build (its sums widened to `$full` slots by the calling
/// module's `widen`), any other `n` with `$full`.
#[cfg(any(target_arch = "x86_64", target_arch = "wasm32"))]
macro_rules! by_kind {
    (@tokens $code:ident, $n:expr, $full:expr, [$($small:literal),*], |$k:ident, $t:ident| $call:expr) => {
        match $n {
            $($small => {
                const $k: u8 = $code;
                const $t: usize = $small;
                widen($call)
            })*
            _ => {
                const $k: u8 = $code;
                const $t: usize = $full;
                $call
            }
        }
    };
    ($kind:expr, $n:expr, $full:expr, [$($small:literal),*], |$k:ident, $t:ident| $call:expr) => {
        match $kind {
            Kind::Q8_0 => by_kind!(@tokens Q8_0, $n, $full, [$($small),*], |$k, $t| $call),
            Kind::Q4_0 => by_kind!(@tokens Q4_0, $n, $full, [$($small),*], |$k, $t| $call),
            Kind::Q4_1 => by_kind!(@tokens Q4_1, $n, $full, [$($small),*], |$k, $t| $call),
            Kind::Q5_0 => by_kind!(@tokens Q5_0, $n, $full, [$($small),*], |$k, $t| $call),
            Kind::Q5_1 => by_kind!(@tokens Q5_1, $n, $full, [$($small),*], |$k, $t| $call),
        }
    };
}

#[cfg(target_arch = "x86_64")]
#[path = "tiles_vnni_avx512.rs"]
mod avx512;

#[cfg(target_arch = "x86_64")]
#[path = "tiles_avx2.rs"]
mod avx2;

#[cfg(target_arch = "wasm32")]
#[path = "tiles_relaxed.rs"]
mod relaxed;

#[path = "tiles_vnni_fill.rs"]
mod fill;
pub(super) use fill::Filler;

// The x86_64 forms against the row path (the relaxed-SIMD form's test runs in the browser:
// `tests/web/cpu.rs`).
#[cfg(all(test, target_arch = "x86_64"))]
#[path = "tiles_vnni_tests.rs"]
mod tests;
