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

    /// Rows of every layer together, per sequence.
    pub fn total_rows(&self) -> u64 {
        // saturating: a context asked for by the user may be absurd
        self.rows
            .iter()
            .fold(0u64, |n, &r| n.saturating_add(r as u64))
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
    fn an_absurd_context_saturates() {
        let l = KvLayout::new(&[None, Some(512)], usize::MAX, 64);
        assert_eq!(l.total_rows(), u64::MAX);
        assert_eq!(l.sequence_bytes(2048), u64::MAX);
        assert_eq!(l.position_bytes(2048), 2048);
    }

    #[test]
    fn without_local_layers_every_return_is_allowed() {
        let l = KvLayout::full(3, 100);
        assert!(!l.has_ring());
        assert!(l.can_return_to(1, 100));
        assert_eq!(l.row(2, 1, 7), 107);
    }
}
