//! [`TokenMask`]: the tokens a constraint allows at one step.

use std::sync::Arc;

use crate::{Error, Result};

/// A set of allowed token ids over a vocabulary of `len` ids, one bit per id (bit `id % 32`
/// of word `id / 32`): the layout a GPU kernel can read directly (`len / 8` bytes, rounded up
/// to whole words).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenMask {
    /// Shared with the selection requests made under the mask (copied only if changed).
    words: Arc<Vec<u32>>,
    len: usize,
}

impl TokenMask {
    /// No token allowed, over `len` ids.
    pub fn none(len: usize) -> Self {
        Self {
            words: Arc::new(vec![0; len.div_ceil(32)]),
            len,
        }
    }

    /// The mask whose bits are `words` (bits past `len` are cleared); `words` must hold
    /// `len.div_ceil(32)` words.
    pub fn from_words(mut words: Vec<u32>, len: usize) -> Result<Self> {
        if words.len() < len.div_ceil(32) {
            return Err(Error::invalid(
                "mask",
                format!("{} words cannot hold {len} token bits", words.len()),
            ));
        }
        words.truncate(len.div_ceil(32));
        if !len.is_multiple_of(32) {
            if let Some(last) = words.last_mut() {
                *last &= (1u32 << (len % 32)) - 1;
            }
        }
        Ok(Self {
            words: Arc::new(words),
            len,
        })
    }

    /// Number of ids the mask covers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mask covers no ids at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `id` is allowed (ids past the end are not).
    pub fn allows(&self, id: u32) -> bool {
        let i = id as usize;
        i < self.len && self.words[i / 32] >> (i % 32) & 1 == 1
    }

    /// Allows or forbids `id` (ignored past the end).
    pub fn set(&mut self, id: u32, allowed: bool) {
        let i = id as usize;
        if i < self.len {
            let bit = 1u32 << (i % 32);
            let words = Arc::make_mut(&mut self.words);
            match allowed {
                true => words[i / 32] |= bit,
                false => words[i / 32] &= !bit,
            }
        }
    }

    /// Number of allowed ids.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The bits, `[len.div_ceil(32)]` words.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// The bits, shared (a selection request carries them to the GPU without a copy).
    pub fn shared_words(&self) -> &Arc<Vec<u32>> {
        &self.words
    }

    /// Sets every forbidden id's logit to `-inf` (`logits` is `[len]`).
    pub fn apply(&self, logits: &mut [f32]) {
        for (chunk, &word) in logits.chunks_mut(32).zip(self.words.iter()) {
            if word == u32::MAX {
                continue;
            }
            for (bit, x) in chunk.iter_mut().enumerate() {
                if word >> bit & 1 == 0 {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_past_the_end_are_never_allowed() {
        let mask = TokenMask::from_words(vec![u32::MAX, u32::MAX], 40).expect("mask");
        assert_eq!(mask.count(), 40);
        assert!(mask.allows(39));
        assert!(!mask.allows(40));
        assert!(TokenMask::from_words(vec![0], 40).is_err());
    }

    #[test]
    fn apply_forbids_exactly_the_cleared_bits() {
        let mut mask = TokenMask::none(70);
        for id in [0, 31, 32, 69] {
            mask.set(id, true);
        }
        mask.set(31, false);
        let mut logits = vec![1.0f32; 70];
        mask.apply(&mut logits);
        let kept: Vec<usize> = (0..70).filter(|&i| logits[i].is_finite()).collect();
        assert_eq!(kept, vec![0, 32, 69]);
        assert_eq!(mask.count(), 3);
    }
}
