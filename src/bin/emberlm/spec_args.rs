//! The speculative decoding flags of `generate`, `chat` and `batch`.

use std::path::PathBuf;

use clap::Args;
use emberlm::engine::Engine;
use emberlm::loader::ModelFiles;
use emberlm::session::{SpecOptions, SpecSource};

use crate::{CliResult, Failure};

/// Speculative decoding: drafts from a second model (`--draft-model`) or from the text so far
/// (`--lookup`), verified by the model several tokens per step. Greedy output is identical to
/// plain decoding; sampled output keeps the model's distribution.
#[derive(Debug, Clone, Default, Args)]
pub struct SpecArgs {
    /// A smaller model with the same vocabulary (GGUF file or Hugging Face folder) that
    /// drafts tokens for the model to verify.
    #[arg(long = "draft-model", alias = "draft_model", value_name = "PATH")]
    pub draft_model: Option<PathBuf>,
    /// Prompt lookup: draft the continuation of the latest earlier occurrence of the last
    /// tokens in the prompt and the output (no second model).
    #[arg(long, conflicts_with = "draft_model")]
    pub lookup: bool,
    /// Tokens drafted per step, 1..=64 (default 4).
    #[arg(long = "spec-k", alias = "spec_k", value_name = "N")]
    pub spec_k: Option<usize>,
    /// Adjust the draft length within [1, 2·k] from the acceptance of each step.
    #[arg(long = "spec-adaptive", alias = "spec_k_adaptive")]
    pub spec_adaptive: bool,
    /// Fall back to plain decoding once the acceptance rate drops below this rate in [0, 1].
    #[arg(
        long = "spec-disable-below",
        alias = "spec_disable_below_accept",
        value_name = "RATE",
        allow_negative_numbers = true
    )]
    pub spec_disable_below: Option<f64>,
    /// When every draft is accepted, do not take the extra token from the model's last row.
    #[arg(long = "no-spec-extra-token", alias = "no_spec_extra_token")]
    pub no_spec_extra_token: bool,
}

impl SpecArgs {
    /// The speculative settings these flags ask for (`None`: plain decoding). A tuning flag
    /// without --draft-model or --lookup is a usage error, as are out-of-range values.
    pub fn options(&self) -> CliResult<Option<SpecOptions>> {
        let source = match (&self.draft_model, self.lookup) {
            (Some(_), _) => SpecSource::Draft,
            (None, true) => SpecSource::Lookup,
            (None, false) => {
                let tuned = self.spec_k.is_some()
                    || self.spec_adaptive
                    || self.spec_disable_below.is_some()
                    || self.no_spec_extra_token;
                if tuned {
                    return Err(Failure::usage(
                        "--spec-k, --spec-adaptive, --spec-disable-below and --no-spec-extra-token need --draft-model PATH or --lookup",
                    ));
                }
                return Ok(None);
            }
        };
        let defaults = SpecOptions::default();
        let o = SpecOptions {
            source: Some(source),
            k: self.spec_k.unwrap_or(defaults.k),
            adaptive: self.spec_adaptive,
            extra_token: !self.no_spec_extra_token,
            disable_below_accept: self
                .spec_disable_below
                .unwrap_or(defaults.disable_below_accept),
        };
        o.validate()
            .map_err(|e| Failure::usage(flag_named(&e.to_string())))?;
        Ok(Some(o))
    }

    /// Loads the draft model into `engine` when --draft-model names one.
    pub fn load_draft(&self, engine: &Engine) -> CliResult<()> {
        if let Some(path) = &self.draft_model {
            let files = ModelFiles::open(path).map_err(|e| {
                Failure::usage(format!(
                    "cannot open the draft model `{}`: {e}",
                    path.display()
                ))
            })?;
            pollster::block_on(engine.load_draft(files))?;
        }
        Ok(())
    }
}

/// A settings error with the flag's spelling in place of the option's.
fn flag_named(message: &str) -> String {
    message
        .replace("spec_disable_below_accept", "--spec-disable-below")
        .replace("spec_k", "--spec-k")
}

/// `/spec` in chat: shows the speculative settings, or changes them: `off`, `lookup`, `draft`
/// (needs --draft-model), `k N`, `adaptive on|off`, `extra on|off`, `disable-below RATE`.
/// Returns the line to print; a bad change leaves the settings as they were.
pub fn spec_command(
    rest: &str,
    spec: &mut Option<SpecOptions>,
    has_draft: bool,
) -> Result<String, String> {
    let words: Vec<&str> = rest.split_whitespace().collect();
    let on_off = |v: Option<&&str>| match v.copied() {
        Some("on") | Some("true") => Ok(true),
        Some("off") | Some("false") => Ok(false),
        _ => Err("expected on or off".to_string()),
    };
    let mut next = spec.clone();
    match words.as_slice() {
        [] => {}
        ["off"] => next = None,
        ["lookup"] | ["draft"] => {
            let source = SpecSource::parse(words[0]).map_err(|e| e.to_string())?;
            if source == SpecSource::Draft && !has_draft {
                return Err("no draft model is loaded (start chat with --draft-model PATH)".into());
            }
            let mut o = next.unwrap_or_default();
            o.source = Some(source);
            next = Some(o);
        }
        [setting, value @ ..] => {
            let Some(o) = next.as_mut() else {
                return Err("speculation is off: `/spec lookup` or `/spec draft` first".into());
            };
            match *setting {
                "k" => {
                    o.k = value
                        .first()
                        .and_then(|v| v.parse().ok())
                        .ok_or("expected a whole number: /spec k N")?
                }
                "adaptive" => o.adaptive = on_off(value.first())?,
                "extra" => o.extra_token = on_off(value.first())?,
                "disable-below" => {
                    o.disable_below_accept = value
                        .first()
                        .and_then(|v| v.parse().ok())
                        .ok_or("expected a rate: /spec disable-below 0.3")?
                }
                other => {
                    return Err(format!(
                        "unknown setting `{other}` (off, lookup, draft, k, adaptive, extra, disable-below)"
                    ))
                }
            }
            o.validate().map_err(|e| e.to_string())?;
        }
    }
    *spec = next;
    Ok(describe(spec.as_ref()))
}

/// One line describing speculative settings.
pub fn describe(spec: Option<&SpecOptions>) -> String {
    match spec {
        None => "speculative = off".to_string(),
        Some(o) => format!(
            "speculative = {} (k {}, adaptive {}, extra token {}, disable below {})",
            o.source.map_or("auto", SpecSource::as_str),
            o.k,
            if o.adaptive { "on" } else { "off" },
            if o.extra_token { "on" } else { "off" },
            o.disable_below_accept
        ),
    }
}
