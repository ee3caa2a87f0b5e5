//! A matrix's tiles in one buffer of 64-byte cache lines ([`TileLines`]), which every tile
//! family ([`super::tiles_vnni`], [`super::tiles_k`], [`super::tiles_q6k`]) keeps its records
//! in.

/// One cache line, the unit the tiles are kept and prefetched in.
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
pub(super) struct Line([u8; 64]);

/// A matrix's tiles in one buffer of cache lines, `[tiles, records, lines per record]` (a
/// record: a super-block of the 16 rows, or a pair of 32-value blocks, with their scales):
/// a product walks its tiles front to back in one stream, which the CPU's own prefetch
/// follows (one thread streaming the 2048-wide Q4_K tiles of the Llama-3.2-1B shape on the
/// 2-core AMD EPYC: 356 ns per super-block and tile with each tile in five arrays of its
/// own, 145–210 ns here).
#[derive(Debug, Clone, Default)]
pub(super) struct TileLines {
    /// Records per tile (a super-block of 16 rows, or a pair of blocks).
    blocks: usize,
    /// Lines per record.
    per_block: usize,
    lines: Vec<Line>,
}

impl TileLines {
    /// `tiles` tiles of `blocks` records of `per_block` lines, zeroed.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub(super) fn new(tiles: usize, blocks: usize, per_block: usize) -> Self {
        let mut t = Self::default();
        t.reshape(tiles, blocks, per_block);
        t
    }

    /// Sized for `tiles` tiles of `blocks` records of `per_block` lines (the buffer kept
    /// where it is large enough; lines kept hold what they held).
    pub(super) fn reshape(&mut self, tiles: usize, blocks: usize, per_block: usize) {
        self.blocks = blocks;
        self.per_block = per_block;
        self.lines.resize(tiles * blocks * per_block, Line([0; 64]));
    }

    /// Records per tile.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub(super) fn blocks(&self) -> usize {
        self.blocks
    }

    /// Each tile's bytes, to be filled apart.
    pub(super) fn tiles_mut(&mut self) -> Vec<&mut [u8]> {
        let per = (self.blocks * self.per_block).max(1);
        self.lines
            .chunks_exact_mut(per)
            .map(bytemuck::cast_slice_mut)
            .collect()
    }

    /// Tile `g`'s bytes (`[records, lines per record, 64]`).
    pub(super) fn tile(&self, g: usize) -> &[u8] {
        let per = self.blocks * self.per_block;
        bytemuck::cast_slice(&self.lines[g * per..][..per])
    }

    /// Bytes held.
    pub(super) fn bytes(&self) -> usize {
        self.lines.len() * 64
    }
}
