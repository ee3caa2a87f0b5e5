//! Where each layer's KV cache keeps a sequence's positions. A layer that attends to every
//! earlier key keeps every position (row `p` of the sequence's rows); a local-attention layer
//! (a sliding window, as Gemma 3's local layers) reads only its latest `window` keys, so it
//! keeps a ring of `window + chunk − 1` rows and position `p` lives in row `p mod ring`. The
//! ring is the least that serves a step of up to `chunk` tokens: the step's first query still
//! reads `window − 1` earlier keys while its last key is written.
//!
//! A ring forgets: moving the fill mark back (reusing a prefix, rejecting draft tokens) is exact
//! only while no row the next step reads was overwritten since, which holds when the highest
//! position written is at most [`KvLayout::slack`] past the new mark.

use super::ModelConfig;
use crate::error::{Error, Result};

/// Rows per sequence of each layer's cache, and the positions a sequence may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    context: usize,
    /// Rows per sequence, per layer: `context`, or a ring's length (`< context`).
    rows: Vec<usize>,
    /// How far back of the highest written position the fill mark may move (see the module).
    slack: usize,
}

impl KvLayout {
    /// Every one of `layers` layers keeps all `context` positions.
    pub fn full(layers: usize, context: usize) -> Self {
        Self {
            context,
            rows: vec![context; layers],
            slack: usize::MAX,
        }
    }

    /// The layout for steps of up to `chunk` tokens and `context` positions, where layer `l`
    /// reads the latest `windows[l]` keys (`None`: every key). A layer whose ring would not be
    /// shorter than the context keeps every position.
    pub fn new(windows: &[Option<u32>], context: usize, chunk: usize) -> Self {
        let mut slack = usize::MAX;
        let rows = windows
            .iter()
            .map(|w| match w {
                Some(w) => {
                    let ring = (*w as usize).saturating_add(chunk.max(1) - 1);
                    if ring < context {
                        // a step of up to `chunk` tokens after moving back s positions reads
                        // keys down to (mark − window + 1); the writes up to `high` destroyed
                        // positions below high − ring, so s ≤ ring − window + 1
                        slack = slack.min(ring + 1 - *w as usize);
                        ring
                    } else {
                        context
                    }
                }
                None => context,
            })
            .collect();
        Self {
            context,
            rows,
            slack,
        }
    }

    /// The layout for `config`'s trained windows (see [`KvLayout::new`]).
    pub fn trained(config: &ModelConfig, context: usize, chunk: usize) -> Self {
        let windows: Vec<_> = (0..config.n_layers)
            .map(|l| config.layer_window(l))
            .collect();
        Self::new(&windows, context, chunk)
    }

    /// Positions one sequence holds at most.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Layers described.
    pub fn layers(&self) -> usize {
        self.rows.len()
    }

    /// Rows one sequence takes in layer `layer`'s cache (the context for a layer that is not a
    /// ring, and for a layer past the last).
    pub fn rows(&self, layer: usize) -> usize {
        self.rows.get(layer).copied().unwrap_or(self.context)
    }

    /// Layer `layer`'s ring length, `None` when it keeps every position.
    pub fn ring(&self, layer: usize) -> Option<usize> {
        let rows = self.rows(layer);
        (rows < self.context).then_some(rows)
    }

    /// Whether any layer is a ring.
    pub fn has_ring(&self) -> bool {
        self.rows.iter().any(|&r| r < self.context)
    }

    /// The row of position `pos` of the sequence in slot `slot` in layer `layer`'s cache.
    pub fn row(&self, layer: usize, slot: usize, pos: usize) -> usize {
        let rows = self.rows(layer);
        slot * rows + pos % rows
    }

    /// How far back of the highest position written the fill mark may move and still find
    /// every key the next step reads (`usize::MAX` without rings).
    pub fn slack(&self) -> usize {
        self.slack
    }

    /// Whether the fill mark may move back to `pos` when positions up to `high` (exclusive)
    /// were written since the cache was last emptied: always without rings, and for position 0.
    pub fn can_return_to(&self, pos: usize, high: usize) -> bool {
        pos == 0 || high.saturating_sub(pos) <= self.slack
    }

    /// The layout of a cache holding the first `positions` positions of this one (at most its
    /// context): each layer keeps `min(positions, rows)` rows, so a ring that has wrapped stays a
    /// ring of the same length.
    pub fn prefix(&self, positions: usize) -> KvLayout {
        let positions = positions.min(self.context);
        Self {
            context: positions,
            rows: self.rows.iter().map(|&r| r.min(positions)).collect(),
            slack: self.slack,
        }
    }

    /// Layers that keep every position (whose rows grow with the context).
    pub fn full_layers(&self) -> usize {
        self.rows.iter().filter(|&&r| r >= self.context).count()
    }

    /// Bytes one more position of context costs a sequence, at `row_bytes` per position and
    /// layer (K and V): its rows in the layers that keep every position.
    pub fn position_bytes(&self, row_bytes: u64) -> u64 {
        row_bytes.saturating_mul(self.full_layers() as u64)
    }

    /// Bytes of one sequence's cache at `row_bytes` per row (K and V): every layer's rows.
    pub fn sequence_bytes(&self, row_bytes: u64) -> u64 {
        row_bytes.saturating_mul(self.total_rows())
    }

    /// The most positions (at most this layout's context) one sequence can hold in `budget`
    /// bytes at `row_bytes` per row: the rings' fixed rows count, and once every layer is a
    /// full ring more positions cost nothing.
    pub fn positions_within(&self, row_bytes: u64, budget: u64) -> usize {
        let fits = |n: usize| self.prefix(n).sequence_bytes(row_bytes) <= budget;
        // bytes grow with the positions: the last that fits, by bisection
        let (mut lo, mut hi) = (0usize, self.context);
        if fits(hi) {
            return hi;
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Rows of every layer together, per sequence.
    pub fn total_rows(&self) -> u64 {
        // saturating: a context asked for by the user may be absurd
        self.rows
            .iter()
            .fold(0u64, |n, &r| n.saturating_add(r as u64))
    }
}

/// The main sequence's fill mark over a [`KvLayout`]: the positions it holds, and one past the
/// highest position written since it was last emptied, which bounds how far back the mark may
/// move while the rings still hold what the next step reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FillMark {
    pos: usize,
    high: usize,
}

impl FillMark {
    /// Positions held (the next token's position).
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Moves the mark to `pos`: back to reuse a common prefix, forward after a step. Fails past
    /// the context, and moving back where a ring no longer holds the keys the next step reads
    /// ([`FillMark::reusable`] says how far back is safe); 0 always succeeds.
    pub fn set(&mut self, pos: usize, layout: &KvLayout) -> Result<()> {
        if pos > layout.context() {
            return Err(Error::invalid(
                "pos",
                format!("{pos} is past the context length {}", layout.context()),
            ));
        }
        if pos < self.pos && !layout.can_return_to(pos, self.high) {
            return Err(Error::invalid(
                "pos",
                format!(
                    "cannot move back to position {pos}: the local layers' rings were overwritten up to position {}",
                    self.high
                ),
            ));
        }
        self.high = if pos == 0 { 0 } else { self.high.max(pos) };
        self.pos = pos;
        Ok(())
    }

    /// One past the highest position written since the mark was last emptied.
    pub fn high(&self) -> usize {
        self.high
    }

    /// A mark holding `pos` positions after writes up to `high`, as a saved conversation
    /// recorded it: fails where `pos` is past the context or `high` is below `pos`, or where
    /// the rings, written up to `high`, no longer hold what continuing from `pos` reads.
    pub fn restored(pos: usize, high: usize, layout: &KvLayout) -> Result<Self> {
        if pos > layout.context() || high < pos {
            return Err(Error::invalid(
                "pos",
                format!(
                    "{pos} positions written up to {high} do not fit a context of {}",
                    layout.context()
                ),
            ));
        }
        if !layout.can_return_to(pos, high) {
            return Err(Error::invalid(
                "pos",
                format!("the local layers' rings, written up to position {high}, no longer hold position {pos}'s keys"),
            ));
        }
        Ok(Self { pos, high })
    }

    /// Records that positions below `end` are being written: called before a step runs, since
    /// a step that fails after writing has still overwritten ring rows.
    pub fn note_written(&mut self, end: usize) {
        self.high = self.high.max(end);
    }

    /// The longest prefix of at most `pos` held positions the cache can still continue from:
    /// `pos`, or 0 where a ring lost keys that continuing would read.
    pub fn reusable(&self, pos: usize, layout: &KvLayout) -> usize {
        let pos = pos.min(self.pos);
        match layout.can_return_to(pos, self.high) {
            true => pos,
            false => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_layers_keep_a_ring_of_window_plus_chunk_minus_one() {
        let l = KvLayout::new(&[Some(512), None, Some(4096)], 2048, 64);
        assert_eq!(l.rows(0), 575);
        assert_eq!(l.ring(0), Some(575));
        // the global layer and a window past the context keep every position
        assert_eq!((l.rows(1), l.ring(1)), (2048, None));
        assert_eq!((l.rows(2), l.ring(2)), (2048, None));
        assert_eq!(l.slack(), 64);
        assert_eq!(l.row(0, 2, 600), 2 * 575 + 25);
        assert_eq!(l.row(1, 2, 600), 2 * 2048 + 600);
        assert!(l.can_return_to(100, 164));
        assert!(!l.can_return_to(100, 165));
        assert!(l.can_return_to(0, 2000));
        assert_eq!(l.total_rows(), 575 + 2 * 2048);
    }

    #[test]
    fn the_fill_mark_moves_back_only_as_far_as_the_rings_allow() {
        // rings of 8 rows for a window of 5 and steps of 4: a slack of 4
        let l = KvLayout::new(&[Some(5), None], 100, 4);
        let mut m = FillMark::default();
        m.set(45, &l).unwrap();
        m.set(41, &l).unwrap();
        assert_eq!(m.reusable(20, &l), 0);
        assert!(m.set(20, &l).unwrap_err().to_string().contains("rings"));
        assert_eq!(m.pos(), 41);
        // a step being written counts before it lands: 41 is then too far back
        m.note_written(50);
        assert_eq!(m.reusable(45, &l), 0);
        assert!(m.set(101, &l).is_err());
        m.set(0, &l).unwrap();
        m.set(3, &l).unwrap();
        m.set(1, &l).unwrap();
    }

    #[test]
    fn an_absurd_context_saturates() {
        let l = KvLayout::new(&[None, Some(512)], usize::MAX, 64);
        assert_eq!(l.total_rows(), u64::MAX);
        assert_eq!(l.sequence_bytes(2048), u64::MAX);
        assert_eq!(l.position_bytes(2048), 2048);
    }

    #[test]
    fn positions_in_a_budget_count_the_rings_fixed_rows() {
        // one global layer and one ring of 575 rows, 100 bytes a row
        let l = KvLayout::new(&[None, Some(512)], 1 << 20, 64);
        // the ring fills first: 300 positions cost 600 rows
        assert_eq!(l.positions_within(100, 60_000), 300);
        // past it each position costs the global layer's row only
        assert_eq!(l.positions_within(100, 100 * (575 + 1000)), 1000);
        assert_eq!(l.positions_within(100, 100 * (575 + 1000) - 1), 999);
        assert_eq!(l.positions_within(100, 0), 0);
        // every layer a ring: past the rings positions are free, up to the layout's context
        let rings = KvLayout::new(&[Some(512), Some(512)], 4096, 64);
        assert_eq!(rings.positions_within(100, 2 * 57_500), 4096);
        // without rings: budget / (row × layers)
        assert_eq!(KvLayout::full(3, 1 << 20).positions_within(10, 3_000), 100);
    }

    #[test]
    fn without_local_layers_every_return_is_allowed() {
        let l = KvLayout::full(3, 100);
        assert!(!l.has_ring());
        assert!(l.can_return_to(1, 100));
        assert_eq!(l.row(2, 1, 7), 107);
    }
}
