//! The kernel plan: which variant (shape) each kernel family runs on this device, and why.
//!
//! Kernel families with more than one shape declare their variants here; the kernels build the
//! variants they are asked for, and nothing but the plan picks which one runs. A plan is forced
//! (`--kernels`, `EMBERLM_KERNELS`, `Engine.load(..., { kernels })`), reused from the
//! [`crate::tune`] store, or measured on the device when a model loads (see
//! [`crate::backend`]).
//!
//! Each family declares its variants as data (see [`super::variants`]): `variants/linear.rs`
//! for the two linear families, `variants/attention.rs` for attention. Every family has a `workgroup` shape (the GPU shape: many invocations share a
//! row and reduce through shared memory) and a `rows` shape (for CPU-like adapters, which run
//! a workgroup's subgroups as fibres and switch at every barrier: no barriers, each invocation
//! owning whole output rows); the plan knows no more of them than the tables say.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

mod overrides;
pub use overrides::{KernelOverrides, SplitOverride, ATTENTION_SPLIT};

pub use super::variants::{AdapterKind, Variant, VariantSpec};
use crate::backend::gpu::variants::attention as attention_variants;
use crate::backend::gpu::variants::linear::{self as linear_variants, LinearChoice};

/// A kernel family that has variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// Linear layers for one token (every fusion: norm, Q/K/V with RoPE and KV write,
    /// SwiGLU, GELU, residual, last-row LM head).
    LinearDecode,
    /// Linear layers for a prefill chunk.
    LinearPrefill,
    /// Attention over the KV cache (decode and prefill).
    Attention,
}

impl Family {
    /// Every family, in the order plans list them.
    pub const ALL: [Family; 3] = [
        Family::LinearDecode,
        Family::LinearPrefill,
        Family::Attention,
    ];

    /// The name used by `--kernels` and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Family::LinearDecode => "linear_decode",
            Family::LinearPrefill => "linear_prefill",
            Family::Attention => "attention",
        }
    }

    /// The family's variants, as its table declares them, the first its default.
    pub fn variants(self) -> Vec<&'static VariantSpec> {
        match self {
            Family::LinearDecode => linear_variants::DECODE.iter().map(|v| &v.spec).collect(),
            Family::LinearPrefill => linear_variants::PREFILL.iter().map(|v| &v.spec).collect(),
            Family::Attention => attention_variants::ALL.iter().map(|v| &v.spec).collect(),
        }
    }

    /// The family's variant called `name`, or an error naming the family's variants.
    pub fn variant_named(self, name: &str) -> Result<Variant> {
        let all = self.variants();
        all.iter()
            .map(|s| s.variant)
            .find(|v| v.name() == name)
            .ok_or_else(|| {
                let known: Vec<&str> = all.iter().map(|s| s.variant.name()).collect();
                Error::invalid(
                    "kernels",
                    format!(
                        "unknown kernel variant `{name}` for {self} (known: {})",
                        known.join(", ")
                    ),
                )
            })
    }

    /// The variant a device gets before (or without) measuring: the first the table guesses
    /// for the adapter's kind (the rows shape on CPU adapters, the workgroup shape elsewhere).
    pub fn guess(self, cpu_adapter: bool) -> Variant {
        let all = self.variants();
        let kind = AdapterKind::of(cpu_adapter);
        all.iter()
            .find(|s| s.guessed_for == kind)
            .or(all.first())
            .map_or(Variant::WORKGROUP, |s| s.variant)
    }
}

impl<'de> Deserialize<'de> for Variant {
    /// A variant by its name, which some family's table must declare (a stored plan naming
    /// a variant this engine no longer has does not parse, and is measured again).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Family::ALL
            .into_iter()
            .find_map(|f| f.variant_named(&name).ok())
            .ok_or_else(|| serde::de::Error::custom(format!("unknown kernel variant `{name}`")))
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Family {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Family::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                Error::invalid(
                    "kernels",
                    format!(
                        "unknown kernel family `{s}` (known: {})",
                        Family::ALL.map(Family::name).join(", ")
                    ),
                )
            })
    }
}

/// How a family's variant was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Timed on this device at this load.
    Measured,
    /// Read from the store (timed at an earlier load).
    Reused,
    /// Forced by the user.
    Forced,
    /// Not timed (the measuring budget ran out first): the adapter-type guess.
    Guessed,
}

/// One timing of one variant: seconds per run of every distinct node of the family.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// The family timed.
    pub family: Family,
    /// The variant timed.
    pub variant: Variant,
    /// Seconds for one dispatch of each distinct shape of the family, summed.
    pub seconds: f64,
}

/// The chosen variant of every family, why, and the timings behind it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelPlan {
    /// Family → (variant, how it was chosen).
    pub choices: BTreeMap<Family, (Variant, Source)>,
    /// What was measured (empty when nothing was).
    pub timings: Vec<Timing>,
    /// Seconds spent measuring at this load.
    pub measure_seconds: f64,
    /// Where the plan is kept (a file or a Cache API URL), when it is.
    pub stored_at: Option<String>,
    /// The attention key split when forced (otherwise the engine's policy: see
    /// [`crate::backend::gpu::ops::KeySplit::policy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_split: Option<SplitOverride>,
    /// Variants that cannot run this model (attention's `rows` shape with heads over 128):
    /// never candidates, and never taken from the store.
    #[serde(skip)]
    pub unavailable: Vec<(Family, Variant)>,
}

impl KernelPlan {
    /// Rules `variant` out for `family` on this model: it is no longer a candidate, and a
    /// choice of it that was guessed or read from the store (a record timed without it, or
    /// from before it was ruled out) goes back to measuring the others. A forced choice
    /// stays, and fails with its reason where it is built.
    pub fn rule_out(&mut self, family: Family, variant: Variant) {
        if !self.unavailable.contains(&(family, variant)) {
            self.unavailable.push((family, variant));
        }
        let Some(&(chosen, source)) = self.choices.get(&family) else {
            return;
        };
        if chosen != variant || source == Source::Forced {
            return;
        }
        let other = family
            .variants()
            .into_iter()
            .map(|s| s.variant)
            .find(|v| !self.unavailable.contains(&(family, *v)));
        if let Some(other) = other {
            self.choices.insert(family, (other, Source::Guessed));
        }
    }

    /// The variant `family` runs.
    pub fn variant(&self, family: Family) -> Variant {
        self.choices
            .get(&family)
            .map(|c| c.0)
            .unwrap_or_else(|| family.guess(false))
    }

    /// The variants the linear layers record in.
    pub fn linear(&self) -> LinearChoice {
        LinearChoice {
            decode: self.variant(Family::LinearDecode),
            prefill: self.variant(Family::LinearPrefill),
        }
    }

    /// A plan with every family at the adapter-type guess, or forced where `overrides` says.
    pub fn guessed(cpu_adapter: bool, overrides: &KernelOverrides) -> Self {
        let choices = Family::ALL
            .into_iter()
            .map(|f| {
                let choice = match overrides.get(f) {
                    Some(v) => (v, Source::Forced),
                    None => (f.guess(cpu_adapter), Source::Guessed),
                };
                (f, choice)
            })
            .collect();
        Self {
            choices,
            timings: Vec::new(),
            measure_seconds: 0.0,
            stored_at: None,
            attention_split: overrides.split(),
            unavailable: Vec::new(),
        }
    }

    /// The variants to build for `family`: the chosen one, or every one while it is to be
    /// measured (`Guessed` means "not decided yet" until measuring ends).
    pub fn candidates(&self, family: Family) -> Vec<Variant> {
        match self.choices.get(&family) {
            Some((v, Source::Guessed)) => {
                let mut all = vec![*v];
                all.extend(
                    family
                        .variants()
                        .iter()
                        .map(|s| s.variant)
                        .filter(|o| o != v),
                );
                all.retain(|o| !self.unavailable.contains(&(family, *o)));
                all
            }
            Some((v, _)) => vec![*v],
            None => family
                .variants()
                .iter()
                .map(|s| s.variant)
                .filter(|o| !self.unavailable.contains(&(family, *o)))
                .collect(),
        }
    }

    /// One line per family: `linear_decode = rows (measured: rows 1.2 ms, workgroup 6.0 ms)`,
    /// then the attention key split.
    pub fn describe(&self) -> Vec<String> {
        let split = match self.attention_split {
            None => format!("{ATTENTION_SPLIT} = long steps of few tokens (policy)"),
            Some(SplitOverride::Off) => format!("{ATTENTION_SPLIT} = off (forced)"),
            Some(SplitOverride::Keys(k)) => {
                format!("{ATTENTION_SPLIT} = {k} keys per split (forced)")
            }
        };
        self.choices
            .iter()
            .map(|(family, (variant, source))| {
                let times: Vec<String> = self
                    .timings
                    .iter()
                    .filter(|t| t.family == *family)
                    .map(|t| format!("{} {:.3} ms", t.variant, t.seconds * 1e3))
                    .collect();
                let source = match source {
                    Source::Measured => "measured",
                    Source::Reused => "reused",
                    Source::Forced => "forced",
                    Source::Guessed => "guessed",
                };
                if times.is_empty() {
                    format!("{family} = {variant} ({source})")
                } else {
                    format!("{family} = {variant} ({source}: {})", times.join(", "))
                }
            })
            .chain([split])
            .collect()
    }
}

impl KernelPlan {
    /// The plan the text of a stored record gives for `key` under `overrides`, as a load
    /// reuses it: `None` when the text is not a trusted record of a whole plan (see
    /// [`crate::tune::parse_record`]).
    pub fn from_record(
        text: &str,
        key: &crate::tune::TuneKey,
        overrides: &KernelOverrides,
    ) -> Option<KernelPlan> {
        match crate::tune::parse_record::<StoredPlan>(text, key) {
            crate::tune::Lookup::Found(stored) => stored.apply(overrides),
            _ => None,
        }
    }
}

/// What a stored plan holds: the chosen variant per family and the timings behind it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredPlan {
    pub choices: BTreeMap<Family, Variant>,
    pub timings: Vec<Timing>,
}

impl StoredPlan {
    /// The plan `self` gives under `overrides`, or `None` if it lacks a family (a plan from an
    /// older engine: measure again).
    pub fn apply(&self, overrides: &KernelOverrides) -> Option<KernelPlan> {
        let mut choices = BTreeMap::new();
        for f in Family::ALL {
            let choice = match overrides.get(f) {
                Some(v) => (v, Source::Forced),
                None => (*self.choices.get(&f)?, Source::Reused),
            };
            choices.insert(f, choice);
        }
        Some(KernelPlan {
            choices,
            timings: self.timings.clone(),
            measure_seconds: 0.0,
            stored_at: None,
            attention_split: overrides.split(),
            unavailable: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored plan that chose a variant this model cannot run (attention's rows shape for
    /// heads of 256, timed as the other by mistake) goes back to measuring the others; a
    /// guessed one never offers it; a forced one stays.
    #[test]
    fn a_variant_ruled_out_is_never_a_candidate_nor_reused() {
        let stored = StoredPlan {
            choices: Family::ALL
                .into_iter()
                .map(|f| (f, Variant::ROWS))
                .collect(),
            timings: Vec::new(),
        };
        let mut reused = stored.apply(&KernelOverrides::none()).unwrap();
        assert_eq!(reused.candidates(Family::Attention), vec![Variant::ROWS]);
        reused.rule_out(Family::Attention, Variant::ROWS);
        assert_eq!(
            reused.choices[&Family::Attention],
            (Variant::WORKGROUP, Source::Guessed)
        );
        assert_eq!(
            reused.candidates(Family::Attention),
            vec![Variant::WORKGROUP]
        );
        assert_eq!(reused.candidates(Family::LinearDecode), vec![Variant::ROWS]);

        let mut guessed = KernelPlan::guessed(true, &KernelOverrides::none());
        guessed.rule_out(Family::Attention, Variant::ROWS);
        assert_eq!(
            guessed.candidates(Family::Attention),
            vec![Variant::WORKGROUP]
        );
        assert_eq!(guessed.variant(Family::Attention), Variant::WORKGROUP);

        let forced = KernelOverrides::none().with(Family::Attention, Variant::ROWS);
        let mut forced = KernelPlan::guessed(true, &forced);
        forced.rule_out(Family::Attention, Variant::ROWS);
        assert_eq!(
            forced.choices[&Family::Attention],
            (Variant::ROWS, Source::Forced)
        );
    }

    #[test]
    fn guessed_plans_measure_every_variant_forced_ones_build_one() {
        let forced = KernelOverrides::none().with(Family::Attention, Variant::WORKGROUP);
        let plan = KernelPlan::guessed(true, &forced);
        assert_eq!(plan.candidates(Family::Attention), vec![Variant::WORKGROUP]);
        assert_eq!(
            plan.candidates(Family::LinearDecode),
            vec![Variant::ROWS, Variant::WORKGROUP]
        );
        assert_eq!(plan.variant(Family::LinearDecode), Variant::ROWS);
        let gpu = KernelPlan::guessed(false, &KernelOverrides::none());
        assert_eq!(gpu.variant(Family::LinearPrefill), Variant::WORKGROUP);
    }

    #[test]
    fn stored_plans_missing_a_family_are_stale() {
        let mut choices = BTreeMap::new();
        choices.insert(Family::LinearDecode, Variant::ROWS);
        let stored = StoredPlan {
            choices: choices.clone(),
            timings: Vec::new(),
        };
        assert!(stored.apply(&KernelOverrides::none()).is_none());
        for f in Family::ALL {
            choices.insert(f, Variant::ROWS);
        }
        let stored = StoredPlan {
            choices,
            timings: Vec::new(),
        };
        let forced = KernelOverrides::none().with(Family::Attention, Variant::WORKGROUP);
        let plan = stored.apply(&forced).unwrap();
        assert_eq!(
            plan.choices[&Family::Attention],
            (Variant::WORKGROUP, Source::Forced)
        );
        assert_eq!(
            plan.choices[&Family::LinearDecode],
            (Variant::ROWS, Source::Reused)
        );
    }

    /// Every family's table has the shapes a whole plan is forced to, each name once, and
    /// each shape's guess is the first the table lists for that adapter kind.
    #[test]
    fn every_family_declares_each_shape_once() {
        for f in Family::ALL {
            let names: Vec<&str> = f.variants().iter().map(|s| s.variant.name()).collect();
            for v in Variant::EVERY_FAMILY {
                assert_eq!(
                    names.iter().filter(|n| **n == v.name()).count(),
                    1,
                    "{f}: {names:?}"
                );
            }
            assert_eq!(f.guess(true), Variant::ROWS, "{f}");
            assert_eq!(f.guess(false), Variant::WORKGROUP, "{f}");
            assert!(f.variant_named("nope").is_err());
        }
    }

    /// A stored plan names variants by name: one this engine's tables do not declare does
    /// not parse (the plan is measured again), one they do round-trips.
    #[test]
    fn stored_variant_names_must_be_declared() {
        let stored = StoredPlan {
            choices: Family::ALL
                .into_iter()
                .map(|f| (f, Variant::ROWS))
                .collect(),
            timings: vec![Timing {
                family: Family::Attention,
                variant: Variant::WORKGROUP,
                seconds: 1e-3,
            }],
        };
        let text = serde_json::to_string(&stored).unwrap();
        assert_eq!(serde_json::from_str::<StoredPlan>(&text).unwrap(), stored);
        let renamed = text.replace("\"rows\"", "\"tiles\"");
        let err = serde_json::from_str::<StoredPlan>(&renamed).unwrap_err();
        assert!(
            err.to_string().contains("unknown kernel variant `tiles`"),
            "{err}"
        );
    }
}
