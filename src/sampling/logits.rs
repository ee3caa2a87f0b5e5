//! Logit arithmetic shared by the processors and the draw: softmax weights in f64, sortable
//! candidate keys, the argmax and the inverse-CDF draw.

use rand_chacha::rand_core::RngCore;
use rand_chacha::ChaCha20Rng;

use crate::{Error, Result};

/// Rejects empty or non-finite logits, naming the first bad index.
pub(super) fn check_logits(logits: &[f32]) -> Result<()> {
    if logits.is_empty() {
        return Err(Error::invalid("logits", "must not be empty, got 0 logits"));
    }
    if let Some((i, x)) = logits.iter().enumerate().find(|(_, x)| !x.is_finite()) {
        return Err(Error::invalid(
            "logits",
            format!("every logit must be finite, got {x} at index {i}"),
        ));
    }
    Ok(())
}

/// Largest element as f64; `-inf` for an empty slice or one holding only `-inf`.
pub(super) fn max_f64(values: impl Iterator<Item = f32>) -> f64 {
    values.fold(f64::NEG_INFINITY, |m, x| m.max(f64::from(x)))
}

/// `exp(x - max)`, exactly zero for filtered (`-inf`) logits; for `x ≤ max` (every caller's
/// case: `max` is the largest) [`weight_at_most`], else the library's `exp`.
#[inline]
pub(super) fn weight(x: f32, max: f64) -> f64 {
    let d = f64::from(x) - max;
    if d > 0.0 {
        crate::math::exp(d)
    } else {
        weight_at_most(x, max)
    }
}

/// [`weight`] for `x ≤ max`, through [`crate::math::softmax_exp_f64`], which a vocabulary's
/// worth of calls take at a fraction of the library's cost (0 where the weight would be
/// subnormal, below 10⁻³⁰⁷ of the largest); a select rather than a branch, so that a loop of
/// them vectorizes.
#[inline(always)]
fn weight_at_most(x: f32, max: f64) -> f64 {
    let e = crate::math::softmax_exp_f64(f64::from(x) - max);
    if x == f32::NEG_INFINITY {
        0.0
    } else {
        e
    }
}

/// `Σ weight(x, max)` over `values` in index order (the bits of the plain sum), with the
/// weights made 64 at a time into a buffer first so that the compiler vectorizes their
/// exponentials, which a sum's dependency chain would keep one at a time. `max` is the
/// largest value.
pub(super) fn sum_weights(values: &[f32], max: f64) -> f64 {
    let mut sum = 0.0;
    let mut buf = [0.0f64; 64];
    for chunk in values.chunks(64) {
        for (w, &x) in buf.iter_mut().zip(chunk) {
            *w = weight_at_most(x, max);
        }
        for w in &buf[..chunk.len()] {
            sum += w;
        }
    }
    sum
}

/// Log of the sum of exponentials of finite, non-empty `logits`, in f64.
pub(super) fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = max_f64(logits.iter().copied());
    max + crate::math::ln(sum_weights(logits, max))
}

/// Log-softmax of `logits` (`[vocab]`), computed stably in f64 and returned as f32; non-finite
/// input -> Error naming the first bad index.
pub fn log_softmax(logits: &[f32]) -> Result<Vec<f32>> {
    check_logits(logits)?;
    let lse = log_sum_exp(logits);
    Ok(logits
        .iter()
        .map(|&x| (f64::from(x) - lse) as f32)
        .collect())
}

/// A uniform draw in `[0, 1)` from the top 53 bits of one `u64`, identical on every target.
pub(super) fn uniform(rng: &mut ChaCha20Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Token `i` as an index into the logits (ids are checked against the vocabulary beforehand).
pub(super) fn ix(id: u32) -> usize {
    id as usize
}

/// A candidate token as one sortable integer: the high half ranks its logit (a larger logit
/// gives a smaller key) and the low half is its id, so ascending keys order candidates by logit,
/// largest first, ties to the lower id. `logit` must not be NaN.
pub(super) fn key(logit: f32, id: u32) -> u64 {
    // `+ 0.0` turns -0.0 into +0.0 so that the two compare equal, as floats do.
    let bits = (logit + 0.0).to_bits();
    // An unsigned integer that grows with the float.
    let ascending = if bits >> 31 == 1 {
        !bits
    } else {
        bits | 0x8000_0000
    };
    (u64::from(!ascending) << 32) | u64::from(id)
}

/// The token id held in a [`key`].
pub(super) fn id_of(key: u64) -> usize {
    ix(key as u32)
}

/// Index of the largest logit, ties to the lowest index; `logits` must not be empty.
pub(super) fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best
}

/// Inverse-CDF draw over the softmax of `work` in index order: the first index whose
/// cumulative weight exceeds `u` times the total (`u` in `[0, 1)`).
pub(super) fn draw(work: &[f32], u: f64) -> usize {
    let max = max_f64(work.iter().copied());
    let target = u * sum_weights(work, max);
    let mut cumulative = 0.0;
    let mut last = 0;
    for (i, &x) in work.iter().enumerate() {
        let w = weight(x, max);
        if w > 0.0 {
            cumulative += w;
            last = i;
            if cumulative > target {
                return i;
            }
        }
    }
    // Rounding can leave the running sum a hair below `target`: take the last survivor.
    last
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::SeedableRng;

    #[test]
    fn the_buffered_sum_has_the_plain_sums_bits() {
        // awkward lengths around the buffer's 64, filtered ids, a wide spread
        for len in [1usize, 63, 64, 65, 200, 49_153] {
            let values: Vec<f32> = (0..len)
                .map(|i| match i % 13 {
                    5 => f32::NEG_INFINITY,
                    k => ((i * 7919) % 1000) as f32 * 0.037 - 30.0 + k as f32,
                })
                .collect();
            let max = max_f64(values.iter().copied());
            let plain: f64 = values.iter().map(|&x| weight(x, max)).sum();
            assert_eq!(
                sum_weights(&values, max).to_bits(),
                plain.to_bits(),
                "{len}"
            );
        }
        let filtered = [f32::NEG_INFINITY; 3];
        assert_eq!(sum_weights(&filtered, max_f64(filtered.into_iter())), 0.0);
    }

    #[test]
    fn uniform_is_in_unit_interval() {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        for _ in 0..10_000 {
            let u = uniform(&mut rng);
            assert!((0.0..1.0).contains(&u), "{u}");
        }
    }

    #[test]
    fn keys_sort_by_logit_descending_then_id() {
        let logits = [
            0.0,
            -0.0,
            1.5,
            -2.0,
            f32::MAX,
            -f32::MAX,
            1.5,
            1e-30,
            -1e-30,
        ];
        let mut keys: Vec<u64> = logits
            .iter()
            .enumerate()
            .map(|(i, &x)| key(x, i as u32))
            .collect();
        keys.sort_unstable();
        let order: Vec<usize> = keys.iter().map(|&k| id_of(k)).collect();
        assert_eq!(order, [4, 2, 6, 7, 0, 1, 8, 3, 5]);
    }
}
