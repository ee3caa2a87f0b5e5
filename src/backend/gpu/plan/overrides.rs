//! What the user forces of the kernel plan (`--kernels`, `EMBERLM_KERNELS`, `Engine.load(...,
//! { kernels })`): a variant per family and the attention key split.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{Family, Variant};
use crate::error::{Error, Result};

/// The `--kernels` name of the attention key split (flash-decoding).
pub const ATTENTION_SPLIT: &str = "attention_split";

/// Variants forced by the user: `linear_decode=rows,attention=workgroup`, or one variant name
/// alone for every family (`rows`); and the attention key split: `attention_split=N` (splits
/// of N keys from 2·N keys on) or `attention_split=off`. Empty forces nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelOverrides {
    variants: BTreeMap<Family, Variant>,
    split: Option<SplitOverride>,
}

/// A forced attention key split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitOverride {
    /// Never split: every step runs whole.
    Off,
    /// Splits of this many keys (at least 1) from two splits' worth of keys on.
    Keys(u32),
}

impl fmt::Display for SplitOverride {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SplitOverride::Off => f.write_str("off"),
            SplitOverride::Keys(k) => write!(f, "{k}"),
        }
    }
}

impl FromStr for SplitOverride {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if s == "off" {
            return Ok(SplitOverride::Off);
        }
        match s.parse::<u32>() {
            Ok(k) if k >= 1 => Ok(SplitOverride::Keys(k)),
            _ => Err(Error::invalid(
                "kernels",
                format!("{ATTENTION_SPLIT} must be `off` or a key count of at least 1, got `{s}`"),
            )),
        }
    }
}

impl KernelOverrides {
    /// Nothing forced.
    pub fn none() -> Self {
        Self::default()
    }

    /// Every family that has a variant called `variant` forced to it.
    pub fn all(variant: Variant) -> Self {
        Self {
            variants: Family::ALL
                .into_iter()
                .filter(|f| f.variants().iter().any(|s| s.variant == variant))
                .map(|f| (f, variant))
                .collect(),
            split: None,
        }
    }

    /// `family` forced to `variant` (replacing what was forced for it).
    pub fn with(mut self, family: Family, variant: Variant) -> Self {
        self.variants.insert(family, variant);
        self
    }

    /// The attention key split forced to `split`.
    pub fn with_split(mut self, split: SplitOverride) -> Self {
        self.split = Some(split);
        self
    }

    /// The forced variant of `family`, if any.
    pub fn get(&self, family: Family) -> Option<Variant> {
        self.variants.get(&family).copied()
    }

    /// The forced attention key split, if any.
    pub fn split(&self) -> Option<SplitOverride> {
        self.split
    }

    /// Whether nothing is forced.
    pub fn is_empty(&self) -> bool {
        self.variants.is_empty() && self.split.is_none()
    }

    /// The overrides in `EMBERLM_KERNELS` (natively; none in the browser or when unset).
    pub fn from_env() -> Result<Self> {
        #[cfg(not(target_arch = "wasm32"))]
        if let Ok(s) = std::env::var("EMBERLM_KERNELS") {
            return s.parse().map_err(|e: Error| match e {
                Error::InvalidArgument { message, .. } => {
                    Error::invalid("EMBERLM_KERNELS", message)
                }
                other => other,
            });
        }
        Ok(Self::none())
    }

    /// These overrides, then `other`'s on top.
    pub fn merged(mut self, other: &KernelOverrides) -> Self {
        self.variants
            .extend(other.variants.iter().map(|(f, v)| (*f, *v)));
        self.split = other.split.or(self.split);
        self
    }
}

impl FromStr for KernelOverrides {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let mut out = Self::none();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match item.split_once('=') {
                Some((name, value)) if name.trim() == ATTENTION_SPLIT => {
                    out.split = Some(value.trim().parse()?);
                }
                Some((family, variant)) => {
                    let family: Family = family.trim().parse()?;
                    out.variants
                        .insert(family, family.variant_named(variant.trim())?);
                }
                None => {
                    let forced = Family::ALL
                        .into_iter()
                        .find_map(|f| f.variant_named(item).ok())
                        .map(Self::all)
                        .ok_or_else(|| {
                            let mut known: Vec<&str> = Family::ALL
                                .into_iter()
                                .flat_map(|f| f.variants())
                                .map(|s| s.variant.name())
                                .collect();
                            known.sort_unstable();
                            known.dedup();
                            Error::invalid(
                                "kernels",
                                format!(
                                    "unknown kernel variant `{item}` (known: {})",
                                    known.join(", ")
                                ),
                            )
                        })?;
                    out = out.merged(&forced);
                }
            }
        }
        Ok(out)
    }
}

impl fmt::Display for KernelOverrides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut items: Vec<String> = self
            .variants
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if let Some(split) = self.split {
            items.push(format!("{ATTENTION_SPLIT}={split}"));
        }
        f.write_str(&items.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_parse_pairs_and_blanket_names() {
        let o: KernelOverrides = "linear_decode=rows, attention=workgroup".parse().unwrap();
        assert_eq!(o.get(Family::LinearDecode), Some(Variant::ROWS));
        assert_eq!(o.get(Family::Attention), Some(Variant::WORKGROUP));
        assert_eq!(o.get(Family::LinearPrefill), None);
        let all: KernelOverrides = "rows".parse().unwrap();
        assert!(Family::ALL
            .iter()
            .all(|f| all.get(*f) == Some(Variant::ROWS)));
        let mixed: KernelOverrides = "rows,attention=workgroup".parse().unwrap();
        assert_eq!(mixed.get(Family::Attention), Some(Variant::WORKGROUP));
        assert_eq!(mixed.get(Family::LinearDecode), Some(Variant::ROWS));
        assert!("".parse::<KernelOverrides>().unwrap().is_empty());
        assert_eq!(o.to_string().parse::<KernelOverrides>().unwrap(), o);
        let split: KernelOverrides = "rows,attention_split=48".parse().unwrap();
        assert_eq!(split.split(), Some(SplitOverride::Keys(48)));
        assert_eq!(split.to_string().parse::<KernelOverrides>().unwrap(), split);
        let off: KernelOverrides = "attention_split=off".parse().unwrap();
        assert_eq!(off.split(), Some(SplitOverride::Off));
        assert_eq!(off.get(Family::Attention), None);
        assert_eq!(split.merged(&off).split(), Some(SplitOverride::Off));
    }

    #[test]
    fn bad_overrides_name_what_is_unknown() {
        for (s, needle) in [
            ("linear=rows", "unknown kernel family `linear`"),
            ("attention=fast", "unknown kernel variant `fast`"),
            ("tiles", "unknown kernel variant `tiles`"),
            (
                "attention_split=0",
                "attention_split must be `off` or a key count",
            ),
            (
                "attention_split=many",
                "attention_split must be `off` or a key count",
            ),
        ] {
            let e = s.parse::<KernelOverrides>().unwrap_err().to_string();
            assert!(e.contains(needle), "{s}: {e}");
        }
    }
}
