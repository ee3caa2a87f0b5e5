//! Interleaved local (sliding-window) and global attention layers, as Gemma 3 trains them:
//! most layers read only their latest `window` keys with their own RoPE base, and every
//! `pattern`-th layer reads the whole context.

use serde::Serialize;

use super::{RopeFreqs, RopeScaling};

/// Which layers attend locally, over how many keys, with which RoPE base.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LocalAttention {
    /// Keys a local layer reads: the latest `window` positions, its own included.
    pub window: usize,
    /// Layer `i` is global when `(i + 1)` is a multiple of `pattern`, local otherwise
    /// (Gemma 3: 6, five local layers then one global).
    pub pattern: usize,
    /// RoPE base of the local layers, unscaled (the global ones use the model's base and
    /// scaling).
    pub rope_theta: f32,
}

/// Gemma 3's published defaults where a file does not say: five local layers per global one,
/// local RoPE base 10,000.
pub const GEMMA3_PATTERN: usize = 6;
/// See [`GEMMA3_PATTERN`].
pub const GEMMA3_LOCAL_ROPE_THETA: f32 = 10_000.0;

impl LocalAttention {
    /// Whether `layer` attends locally.
    pub fn is_local(&self, layer: usize) -> bool {
        !(layer + 1).is_multiple_of(self.pattern.max(1))
    }

    /// The RoPE of a local layer.
    pub fn rope(&self) -> RopeFreqs {
        RopeFreqs {
            theta: self.rope_theta,
            scaling: RopeScaling::None,
        }
    }

    /// A description of the check that failed, or `None` when the numbers are usable.
    pub fn problem(&self) -> Option<String> {
        if self.window == 0 || self.window > u32::MAX as usize {
            return Some(format!(
                "sliding window {} is outside 1..=2^32-1",
                self.window
            ));
        }
        if self.pattern == 0 {
            return Some("sliding-window layer pattern 0 (must be at least 1)".into());
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Some(format!(
                "local rope theta {} must be finite and > 0",
                self.rope_theta
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sixth_layer_is_global() {
        let l = LocalAttention {
            window: 512,
            pattern: GEMMA3_PATTERN,
            rope_theta: GEMMA3_LOCAL_ROPE_THETA,
        };
        let global: Vec<usize> = (0..18).filter(|&i| !l.is_local(i)).collect();
        assert_eq!(global, vec![5, 11, 17]);
        assert!(l.problem().is_none());
        assert!(LocalAttention {
            window: 0,
            ..l.clone()
        }
        .problem()
        .unwrap()
        .contains("sliding window 0"));
        assert!(LocalAttention { pattern: 0, ..l }
            .problem()
            .unwrap()
            .contains("pattern 0"));
    }
}
