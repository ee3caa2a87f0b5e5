//! RoPE frequency scaling, which stretches a model's positions past the context it was trained
//! on: linear (position interpolation), Llama 3.1's smoothed scaling, and per-pair divisors as
//! llama.cpp stores Llama 3's (`rope_freqs.weight`). Every consumer (the GPU tables, the CPU
//! reference) takes its frequencies from [`RopeFreqs::frequency`], in f64.

use crate::error::{Error, Result};

/// How a model scales its RoPE frequencies.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeScaling {
    /// The plain frequencies `theta^(−2i/d)`.
    #[default]
    None,
    /// Every frequency divided by `factor`.
    Linear {
        /// The stretch, > 0 (1: none).
        factor: f32,
    },
    /// Llama 3.1: wavelengths shorter than `original_context / high_freq_factor` keep their
    /// frequency, those longer than `original_context / low_freq_factor` are divided by
    /// `factor`, and the band between is interpolated.
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f32,
        /// Wavelengths above `original_context / low_freq_factor` are scaled fully.
        low_freq_factor: f32,
        /// Wavelengths below `original_context / high_freq_factor` are kept.
        high_freq_factor: f32,
        /// The context the model was first trained with.
        original_context: usize,
    },
    /// One divisor per rotated pair (`head_dim / 2` of them).
    Factors(Vec<f32>),
}

impl RopeScaling {
    /// Checks the parameters (positive finite factors, ordered bands, a divisor per pair for a
    /// head of `head_dim`), naming the bad one.
    pub fn check(&self, head_dim: usize) -> Result<()> {
        let positive = |name: &'static str, v: f32| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(Error::invalid(
                    name,
                    format!("RoPE scaling needs a positive finite {name}, got {v}"),
                ))
            }
        };
        match self {
            RopeScaling::None => Ok(()),
            RopeScaling::Linear { factor } => positive("rope_scaling.factor", *factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_context,
            } => {
                positive("rope_scaling.factor", *factor)?;
                positive("rope_scaling.low_freq_factor", *low_freq_factor)?;
                positive("rope_scaling.high_freq_factor", *high_freq_factor)?;
                if high_freq_factor <= low_freq_factor {
                    return Err(Error::invalid(
                        "rope_scaling.high_freq_factor",
                        format!(
                            "must exceed low_freq_factor {low_freq_factor}, got {high_freq_factor}"
                        ),
                    ));
                }
                if *original_context == 0 {
                    return Err(Error::invalid(
                        "rope_scaling.original_max_position_embeddings",
                        "must be at least 1",
                    ));
                }
                Ok(())
            }
            RopeScaling::Factors(f) => {
                if f.len() != head_dim / 2 {
                    return Err(Error::invalid(
                        "rope_freqs",
                        format!(
                            "{} frequency divisors for heads of {head_dim} ({} pairs)",
                            f.len(),
                            head_dim / 2
                        ),
                    ));
                }
                f.iter().try_for_each(|&v| positive("rope_freqs", v))
            }
        }
    }

    /// A short description (`llama3 ×8`, `linear ×4`, `none`).
    pub fn describe(&self) -> String {
        match self {
            RopeScaling::None => "none".into(),
            RopeScaling::Linear { factor } => format!("linear ×{factor}"),
            RopeScaling::Llama3 {
                factor,
                original_context,
                ..
            } => format!("llama3 ×{factor} from {original_context}"),
            RopeScaling::Factors(f) => format!("{} per-pair divisors", f.len()),
        }
    }
}

/// A model's RoPE: the base and the scaling.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeFreqs {
    /// Base frequency (10,000 for Llama 2).
    pub theta: f32,
    /// Scaling of the frequencies.
    pub scaling: RopeScaling,
}

impl From<f32> for RopeFreqs {
    fn from(theta: f32) -> Self {
        Self {
            theta,
            scaling: RopeScaling::None,
        }
    }
}

impl From<&RopeFreqs> for RopeFreqs {
    fn from(r: &RopeFreqs) -> Self {
        r.clone()
    }
}

impl RopeFreqs {
    /// Radians per position of rotated pair `i` of a head of `head_dim`.
    pub fn frequency(&self, i: usize, head_dim: usize) -> f64 {
        let base = f64::from(self.theta).powf(-2.0 * i as f64 / head_dim as f64);
        match &self.scaling {
            RopeScaling::None => base,
            RopeScaling::Linear { factor } => base / f64::from(*factor),
            RopeScaling::Factors(f) => base / f64::from(f.get(i).copied().unwrap_or(1.0)),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_context,
            } => {
                let (factor, low, high) = (
                    f64::from(*factor),
                    f64::from(*low_freq_factor),
                    f64::from(*high_freq_factor),
                );
                let old = *original_context as f64;
                let wavelen = std::f64::consts::TAU / base;
                if wavelen < old / high {
                    base
                } else if wavelen > old / low {
                    base / factor
                } else {
                    let smooth = (old / wavelen - low) / (high - low);
                    (1.0 - smooth) * base / factor + smooth * base
                }
            }
        }
    }

    /// Every pair's frequency for a head of `head_dim`.
    pub fn frequencies(&self, head_dim: usize) -> Vec<f64> {
        (0..head_dim / 2)
            .map(|i| self.frequency(i, head_dim))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn freqs(scaling: RopeScaling) -> Vec<f64> {
        RopeFreqs {
            theta: 500_000.0,
            scaling,
        }
        .frequencies(64)
    }

    #[test]
    fn linear_divides_and_llama3_keeps_high_scales_low_and_blends_between() {
        let plain = freqs(RopeScaling::None);
        let linear = freqs(RopeScaling::Linear { factor: 4.0 });
        for (p, l) in plain.iter().zip(&linear) {
            assert!((p / 4.0 - l).abs() <= 1e-15 * p);
        }
        let llama3 = freqs(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_context: 8192,
        });
        let (mut kept, mut scaled, mut blended) = (0, 0, 0);
        for (i, (&p, &f)) in plain.iter().zip(&llama3).enumerate() {
            let wavelen = std::f64::consts::TAU / p;
            if wavelen < 8192.0 / 4.0 {
                assert_eq!(f, p, "pair {i}");
                kept += 1;
            } else if wavelen > 8192.0 {
                assert!((f - p / 8.0).abs() <= 1e-15 * p, "pair {i}");
                scaled += 1;
            } else {
                // between the two, and moving monotonically from p to p / 8
                assert!(f < p && f > p / 8.0, "pair {i}: {f} vs {p}");
                blended += 1;
            }
        }
        assert!(
            kept > 0 && scaled > 0 && blended > 0,
            "{kept} {scaled} {blended}"
        );
        // Hugging Face's formula at one blended pair, by hand
        let i = (0..32)
            .find(|&i| {
                let w = std::f64::consts::TAU / plain[i];
                (2048.0..=8192.0).contains(&w)
            })
            .unwrap_or(0);
        let w = std::f64::consts::TAU / plain[i];
        let smooth = (8192.0 / w - 1.0) / 3.0;
        let want = (1.0 - smooth) * plain[i] / 8.0 + smooth * plain[i];
        assert!((llama3[i] - want).abs() <= 1e-15 * want);
        let factors: Vec<f32> = (0..32).map(|i| 1.0 + i as f32).collect();
        let by_pair = freqs(RopeScaling::Factors(factors));
        assert!((by_pair[5] - plain[5] / 6.0).abs() <= 1e-15 * plain[5]);
    }

    #[test]
    fn bad_parameters_are_named() {
        let name = |s: RopeScaling| match s.check(64) {
            Err(Error::InvalidArgument { name, .. }) => name.to_string(),
            other => format!("{other:?}"),
        };
        assert_eq!(
            name(RopeScaling::Linear { factor: 0.0 }),
            "rope_scaling.factor"
        );
        let bands = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 4.0,
            high_freq_factor: 1.0,
            original_context: 8192,
        };
        assert_eq!(name(bands), "rope_scaling.high_freq_factor");
        assert_eq!(name(RopeScaling::Factors(vec![1.0; 31])), "rope_freqs");
        assert!(RopeScaling::Factors(vec![1.0; 32]).check(64).is_ok());
    }
}
