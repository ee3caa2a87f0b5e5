//! RoPE frequency scaling, which stretches a model's positions past the context it was trained
//! on: linear (position interpolation), Llama 3.1's smoothed scaling, YaRN, and per-pair
//! divisors as llama.cpp stores Llama 3's (`rope_freqs.weight`). Every consumer (the GPU
//! tables, the CPU backend, the f64 reference) takes its frequencies from
//! [`RopeFreqs::frequency`], in f64, and YaRN's attention factor from
//! [`RopeScaling::attention_factor`].

use std::f64::consts::TAU;

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
    /// YaRN (Peng et al., as Hugging Face and llama.cpp compute it): pairs that turn more than
    /// `beta_fast` times over the original context keep their frequency, those turning fewer
    /// than `beta_slow` times are divided by `factor`, with a linear ramp over the pair index
    /// between; the rotated queries and keys are multiplied by `attention_factor` (the
    /// attention scores by its square).
    Yarn {
        /// Divisor of the low frequencies.
        factor: f32,
        /// The context the model was first trained with.
        original_context: usize,
        /// Turns over the original context above which a pair keeps its frequency (32).
        beta_fast: f32,
        /// Turns below which a pair is divided by `factor` fully (1).
        beta_slow: f32,
        /// Multiplier of the rotation's cos and sin (default `0.1 · ln(factor) + 1`).
        attention_factor: f32,
    },
    /// One divisor per rotated pair (`head_dim / 2` of them).
    Factors(Vec<f32>),
}

/// YaRN's default attention factor for a stretch of `factor`: `0.1 · ln(factor) + 1` (1 for
/// no stretch).
pub fn yarn_default_attention_factor(factor: f32) -> f32 {
    if factor <= 1.0 {
        1.0
    } else {
        (0.1 * crate::math::ln(f64::from(factor)) + 1.0) as f32
    }
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
            RopeScaling::Yarn {
                factor,
                original_context,
                beta_fast,
                beta_slow,
                attention_factor,
            } => {
                positive("rope_scaling.factor", *factor)?;
                positive("rope_scaling.beta_fast", *beta_fast)?;
                positive("rope_scaling.beta_slow", *beta_slow)?;
                positive("rope_scaling.attention_factor", *attention_factor)?;
                if beta_fast <= beta_slow {
                    return Err(Error::invalid(
                        "rope_scaling.beta_fast",
                        format!("must exceed beta_slow {beta_slow}, got {beta_fast}"),
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
            RopeScaling::Yarn {
                factor,
                original_context,
                ..
            } => format!("yarn ×{factor} from {original_context}"),
            RopeScaling::Factors(f) => format!("{} per-pair divisors", f.len()),
        }
    }

    /// The multiplier of the rotated queries and keys (YaRN's attention factor; 1 otherwise).
    pub fn attention_factor(&self) -> f32 {
        match self {
            RopeScaling::Yarn {
                attention_factor, ..
            } => *attention_factor,
            _ => 1.0,
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
        let base = crate::math::pow(f64::from(self.theta), -2.0 * i as f64 / head_dim as f64);
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
            RopeScaling::Yarn {
                factor,
                original_context,
                beta_fast,
                beta_slow,
                ..
            } => {
                // the pair index at which a pair turns `turns` times over the original context
                let d = head_dim as f64;
                let theta = f64::from(self.theta);
                let at = |turns: f32| {
                    let wavelengths = *original_context as f64 / (f64::from(turns) * TAU);
                    d * crate::math::ln(wavelengths) / (2.0 * crate::math::ln(theta))
                };
                let low = at(*beta_fast).floor().max(0.0);
                let high = at(*beta_slow).ceil().min(d - 1.0);
                let span = if high == low { 0.001 } else { high - low };
                // 0 up to `low` (kept), 1 from `high` on (divided)
                let ramp = ((i as f64 - low) / span).clamp(0.0, 1.0);
                let keep = 1.0 - ramp;
                base / f64::from(*factor) * (1.0 - keep) + base * keep
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

    /// YaRN against Hugging Face's formula by hand (Qwen's settings on a head of 64: pairs
    /// below the fast bound kept, above the slow bound divided, a ramp between), and the
    /// default attention factor.
    #[test]
    fn yarn_keeps_fast_pairs_divides_slow_ones_and_ramps_between() {
        let yarn = RopeFreqs {
            theta: 1_000_000.0,
            scaling: RopeScaling::Yarn {
                factor: 4.0,
                original_context: 32_768,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: yarn_default_attention_factor(4.0),
            },
        };
        let plain = RopeFreqs::from(1_000_000.0f32).frequencies(64);
        let got = yarn.frequencies(64);
        // correction dims: 64 · ln(32768 / (β · 2π)) / (2 · ln 1e6)
        let dim = |beta: f64| 64.0 * (32_768.0 / (beta * TAU)).ln() / (2.0 * 1e6f64.ln());
        let (low, high) = (dim(32.0).floor(), dim(1.0).ceil());
        assert_eq!((low, high), (11.0, 20.0));
        for (i, (&p, &f)) in plain.iter().zip(&got).enumerate() {
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let want = p / 4.0 * ramp + p * (1.0 - ramp);
            assert!((f - want).abs() <= 1e-15 * p, "pair {i}: {f} vs {want}");
        }
        assert_eq!(got[0], plain[0]);
        assert!((got[31] - plain[31] / 4.0).abs() <= 1e-15 * plain[31]);
        let m = yarn.scaling.attention_factor();
        assert!((f64::from(m) - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-6, "{m}");
        assert_eq!(RopeScaling::None.attention_factor(), 1.0);
        assert_eq!(yarn_default_attention_factor(1.0), 1.0);
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
        let yarn = |beta_fast: f32| RopeScaling::Yarn {
            factor: 4.0,
            original_context: 4096,
            beta_fast,
            beta_slow: 1.0,
            attention_factor: 1.1,
        };
        assert_eq!(name(yarn(0.5)), "rope_scaling.beta_fast");
        assert!(yarn(32.0).check(64).is_ok());
        assert!(RopeScaling::Factors(vec![1.0; 32]).check(64).is_ok());
    }
}
