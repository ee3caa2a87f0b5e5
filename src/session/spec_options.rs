//! What speculative decoding takes and reports: [`SpecOptions`] (where drafts come from, how
//! many, adaptive length, fallback) and [`SpecStats`].

use serde::Serialize;

use crate::error::{Error, Result};
use crate::sampling::speculative::SPEC_MAX_K;

/// Where a speculative step's drafted tokens come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecSource {
    /// A second, smaller model with the same vocabulary ([`super::Session::load_draft`]).
    Draft,
    /// Prompt lookup: the continuation of the latest earlier occurrence of the last tokens
    /// (n-gram, n from 3 down to 1) in the prompt and the generated text.
    Lookup,
}

impl SpecSource {
    /// `draft` or `lookup`.
    pub fn as_str(self) -> &'static str {
        match self {
            SpecSource::Draft => "draft",
            SpecSource::Lookup => "lookup",
        }
    }

    /// Parses `draft` or `lookup`; anything else is an error naming `spec_source`.
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "draft" => Ok(SpecSource::Draft),
            "lookup" => Ok(SpecSource::Lookup),
            other => Err(Error::invalid(
                "speculative.method",
                format!("must be `draft` or `lookup`, got `{other}`"),
            )),
        }
    }
}

/// The verification rule. Modified rejection sampling is the one that keeps the target's
/// distribution exactly (and greedy output token for token).
pub const SPEC_METHOD: &str = "reject_sampling";

/// Speculative decoding settings (names as users look for them: `spec_k`,
/// `spec_k_adaptive`, `spec_method`, `spec_extra_token`, `spec_disable_below_accept`).
#[derive(Clone, Debug, PartialEq)]
pub struct SpecOptions {
    /// Where drafts come from (`None`: the draft model when one is loaded, else lookup).
    pub source: Option<SpecSource>,
    /// Tokens drafted per step, `1..=64`. Default 4.
    pub k: usize,
    /// Adjust the draft length within `[1, 2·k]` from the acceptance of each step. Default off.
    pub adaptive: bool,
    /// When every drafted token is accepted, take one more token from the target's last row
    /// (free: the verification computed it). Default on.
    pub extra_token: bool,
    /// Fall back to plain decoding once the running acceptance rate drops below this
    /// (`0..=1`, judged after `2·k` drafted tokens). Default 0 (never).
    pub disable_below_accept: f64,
}

impl Default for SpecOptions {
    fn default() -> Self {
        Self {
            source: None,
            k: 4,
            adaptive: false,
            extra_token: true,
            disable_below_accept: 0.0,
        }
    }
}

impl SpecOptions {
    /// Checks every setting, naming the bad one.
    pub fn validate(&self) -> Result<()> {
        if self.k == 0 || self.k > SPEC_MAX_K {
            return Err(Error::invalid(
                "spec_k",
                format!("must be in 1..={SPEC_MAX_K}, got {}", self.k),
            ));
        }
        if !(0.0..=1.0).contains(&self.disable_below_accept) {
            return Err(Error::invalid(
                "spec_disable_below_accept",
                format!(
                    "must be a rate in [0, 1], got {}",
                    self.disable_below_accept
                ),
            ));
        }
        Ok(())
    }

    /// The setting a key of the JSON form names, in any of its spellings (`k`, `spec_k`,
    /// `specK` are `k`), or `None` for an unknown key.
    pub fn setting(key: &str) -> Option<&'static str> {
        const SETTINGS: [(&str, &[&str]); 6] = [
            ("method", &["method", "spec_source", "specSource"]),
            ("k", &["k", "spec_k", "specK"]),
            (
                "adaptive",
                &["adaptive", "spec_k_adaptive", "specKAdaptive"],
            ),
            (
                "extra_token",
                &[
                    "extra_token",
                    "extraToken",
                    "spec_extra_token",
                    "specExtraToken",
                ],
            ),
            (
                "disable_below_accept",
                &[
                    "disable_below_accept",
                    "disableBelowAccept",
                    "spec_disable_below_accept",
                    "specDisableBelowAccept",
                ],
            ),
            ("spec_method", &["spec_method", "specMethod"]),
        ];
        SETTINGS
            .iter()
            .find(|(_, names)| names.contains(&key))
            .map(|(name, _)| *name)
    }

    /// Parses the JSON form: an object with `method` (`draft` | `lookup`), `k`, `adaptive`,
    /// `extra_token` (`extraToken`), `disable_below_accept` (`disableBelowAccept`) and
    /// `spec_method` (`specMethod`, only `reject_sampling`), each also under its flat name
    /// ([`SpecOptions::setting`]); `true` means all defaults. Checks types only;
    /// [`SpecOptions::validate`] checks the ranges.
    pub fn from_json(value: &serde_json::Value) -> Result<Option<Self>> {
        let map = match value {
            serde_json::Value::Null | serde_json::Value::Bool(false) => return Ok(None),
            serde_json::Value::Bool(true) => return Ok(Some(Self::default())),
            serde_json::Value::Object(map) => map,
            other => {
                return Err(Error::invalid(
                    "speculative",
                    format!("expected an object of speculative settings or true, got {other}"),
                ))
            }
        };
        let mut out = Self::default();
        for (key, v) in map {
            let number = |name: &'static str| {
                v.as_f64().ok_or_else(|| {
                    Error::invalid(name, format!("`{name}` must be a number, got {v}"))
                })
            };
            let flag = |name: &'static str| {
                v.as_bool().ok_or_else(|| {
                    Error::invalid(name, format!("`{name}` must be true or false, got {v}"))
                })
            };
            match Self::setting(key).unwrap_or("") {
                "method" => match v.as_str() {
                    Some(s) => out.source = Some(SpecSource::parse(s)?),
                    None => return Err(Error::invalid("speculative.method", "must be a string")),
                },
                "k" => {
                    let k = number("spec_k")?;
                    if k.fract() != 0.0 || k < 0.0 {
                        return Err(Error::invalid(
                            "spec_k",
                            format!("must be a whole number, got {v}"),
                        ));
                    }
                    out.k = k as usize;
                }
                "adaptive" => {
                    out.adaptive = flag("spec_k_adaptive")?
                }
                "extra_token" => {
                    out.extra_token = flag("spec_extra_token")?
                }
                "disable_below_accept" => {
                    out.disable_below_accept = number("spec_disable_below_accept")?
                }
                "spec_method" => {
                    if v.as_str() != Some(SPEC_METHOD) {
                        return Err(Error::invalid(
                            "spec_method",
                            format!("only `{SPEC_METHOD}` exists, got {v}"),
                        ));
                    }
                }
                _ => {
                    return Err(Error::invalid(
                        "speculative",
                        format!("unknown setting `{key}` (method, k, adaptive, extra_token, disable_below_accept, spec_method)"),
                    ))
                }
            }
        }
        Ok(Some(out))
    }
}

/// What speculation did during one call.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SpecStats {
    /// `draft` or `lookup`.
    pub method: String,
    /// Tokens drafted.
    pub drafted: usize,
    /// Drafted tokens the target accepted.
    pub accepted: usize,
    /// `accepted / drafted` (0 when nothing was drafted).
    pub acceptance_rate: f64,
    /// Target forward steps after the prompt (verifications and plain steps).
    pub target_steps: usize,
    /// The draft length at the end (it moves with `adaptive`; 0 once the fallback turned
    /// speculation off).
    pub k_final: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Option<SpecOptions>> {
        let v: serde_json::Value =
            serde_json::from_str(json).map_err(|e| Error::invalid("test", e.to_string()))?;
        let o = SpecOptions::from_json(&v)?;
        if let Some(o) = &o {
            o.validate()?;
        }
        Ok(o)
    }

    fn name_of(r: Result<Option<SpecOptions>>) -> String {
        match r {
            Err(Error::InvalidArgument { name, .. }) => name.to_string(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn json_settings_parse_in_both_spellings_and_bad_ones_are_named() {
        let o = parse(
            r#"{"method": "lookup", "k": 6, "adaptive": true, "extraToken": false, "disableBelowAccept": 0.3}"#,
        );
        let Ok(Some(o)) = o else {
            panic!("{o:?}");
        };
        assert_eq!(o.source, Some(SpecSource::Lookup));
        assert_eq!((o.k, o.adaptive, o.extra_token), (6, true, false));
        assert!((o.disable_below_accept - 0.3).abs() < 1e-12);
        assert_eq!(parse("true").ok(), Some(Some(SpecOptions::default())));
        assert_eq!(parse("null").ok(), Some(None));
        assert_eq!(name_of(parse(r#"{"k": 0}"#)), "spec_k");
        assert_eq!(name_of(parse(r#"{"k": 65}"#)), "spec_k");
        assert_eq!(name_of(parse(r#"{"k": 2.5}"#)), "spec_k");
        assert_eq!(
            name_of(parse(r#"{"disable_below_accept": 1.5}"#)),
            "spec_disable_below_accept"
        );
        assert_eq!(
            name_of(parse(r#"{"method": "oracle"}"#)),
            "speculative.method"
        );
        assert_eq!(
            name_of(parse(r#"{"spec_method": "typical"}"#)),
            "spec_method"
        );
        assert_eq!(name_of(parse(r#"{"kk": 1}"#)), "speculative");
    }
}
