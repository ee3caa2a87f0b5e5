//! Generation parameters: defaults, range checks and JSON parsing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Most stop strings accepted in [`SamplingParams::stop`].
pub const MAX_STOP_STRINGS: usize = 16;
/// Most beams accepted in [`SamplingParams::num_beams`].
pub const MAX_BEAMS: usize = 16;
/// Most sequences accepted in [`SamplingParams::num_return_sequences`].
pub const MAX_RETURN_SEQUENCES: usize = 64;
/// Largest magnitude accepted for a [`SamplingParams::logit_bias`] entry.
pub const MAX_LOGIT_BIAS: f32 = 100.0;
/// Largest magnitude accepted for the presence and frequency penalties.
pub const MAX_OPENAI_PENALTY: f32 = 2.0;

/// Largest seed [`draw_seed`] returns, `2^53 - 1`: a drawn seed is reported to the caller
/// (to repeat the run with it) and must survive a JavaScript number.
pub const MAX_DRAWN_SEED: u64 = (1 << 53) - 1;

/// Draws a seed from the system's random source (below 2^53, see [`MAX_DRAWN_SEED`]): the
/// one place a seed is chosen when [`SamplingParams::seed`] is `None`.
pub fn draw_seed() -> Result<u64> {
    let seed = getrandom::u64().map_err(|e| {
        Error::invalid(
            "seed",
            format!("none was given and the system random source failed ({e}); pass a seed"),
        )
    })?;
    Ok(seed & MAX_DRAWN_SEED)
}

/// Named sampling settings (`preset`): temperature, top-k and top-p for a style of output.
/// Fields given explicitly beside a preset override it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// Temperature 0.3, top-k 20: focused, repeatable answers.
    Conservative,
    /// Temperature 0.8, top-k 50, top-p 0.9: the everyday setting.
    Balanced,
    /// Temperature 1.3, top-k 100, top-p 0.95: varied, surprising text.
    Creative,
}

impl Preset {
    /// Every preset, in order.
    pub const ALL: [Preset; 3] = [Preset::Conservative, Preset::Balanced, Preset::Creative];

    /// The name users write.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Conservative => "conservative",
            Preset::Balanced => "balanced",
            Preset::Creative => "creative",
        }
    }

    /// `(temperature, top_k, top_p)` of the preset.
    pub fn values(self) -> (f32, usize, f32) {
        match self {
            Preset::Conservative => (0.3, 20, 1.0),
            Preset::Balanced => (0.8, 50, 0.9),
            Preset::Creative => (1.3, 100, 0.95),
        }
    }
}

impl std::str::FromStr for Preset {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let wanted = s.trim().to_ascii_lowercase();
        Preset::ALL
            .into_iter()
            .find(|p| p.name() == wanted)
            .ok_or_else(|| {
                Error::invalid(
                    "preset",
                    format!("`{s}` is not a preset (conservative, balanced or creative)"),
                )
            })
    }
}

/// Everything that controls how tokens are chosen and when generation ends.
///
/// Every field has a default (see [`Default`]: the `balanced` preset and 100 new tokens), so a
/// JSON object only needs the fields it changes. Field names are snake_case; each multi-word field also accepts its camelCase alias
/// (`topK`, `maxNewTokens`, ...).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingParams {
    /// Softmax temperature, `>= 0` and finite; `0` means greedy (argmax). Default 0.8.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` turns the filter off. Default 50.
    #[serde(alias = "topK")]
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest most-likely set whose probability reaches `top_p`;
    /// in `(0, 1]`, `1` is off. Default 0.9.
    #[serde(alias = "topP")]
    pub top_p: f32,
    /// Keep tokens whose probability is at least `min_p` times the largest probability;
    /// in `[0, 1]`, `0` is off. Default 0.0.
    #[serde(alias = "minP")]
    pub min_p: f32,
    /// Locally typical sampling mass; in `(0, 1]`, `1` is off. Default 1.0.
    #[serde(alias = "typicalP")]
    pub typical_p: f32,
    /// Repetition penalty (Hugging Face semantics), `> 0` and finite; `1` is off. Default 1.0.
    #[serde(alias = "repetitionPenalty")]
    pub repetition_penalty: f32,
    /// Presence penalty (OpenAI semantics), in `[-2, 2]`. Default 0.
    #[serde(alias = "presencePenalty")]
    pub presence_penalty: f32,
    /// Frequency penalty (OpenAI semantics), in `[-2, 2]`. Default 0.
    #[serde(alias = "frequencyPenalty")]
    pub frequency_penalty: f32,
    /// How many of the most recent history tokens the penalties look at; `0` means all. Default 0.
    #[serde(alias = "penaltyLastN")]
    pub penalty_last_n: usize,
    /// Added to the logit of each listed token id; each bias finite and in `[-100, 100]`.
    #[serde(alias = "logitBias")]
    pub logit_bias: BTreeMap<u32, f32>,
    /// Random seed; `None` draws one with [`draw_seed`]. Default `None`.
    pub seed: Option<u64>,
    /// Most tokens generated after the prompt; `0` is allowed. Default 100
    /// ([`DEFAULT_MAX_NEW_TOKENS`]).
    #[serde(alias = "maxNewTokens")]
    pub max_new_tokens: usize,
    /// Stop strings (each non-empty, at most 16); generated text ends before the first match.
    pub stop: Vec<String>,
    /// Token ids that end generation, besides the model's end-of-sequence tokens.
    #[serde(alias = "stopTokenIds")]
    pub stop_token_ids: Vec<u32>,
    /// Beam count for beam search, `1..=16`; `1` means no beam search. Default 1.
    #[serde(alias = "numBeams")]
    pub num_beams: usize,
    /// Beam-search length penalty exponent, finite. Default 1.0.
    #[serde(alias = "lengthPenalty")]
    pub length_penalty: f32,
    /// Beam search stops as soon as `num_beams` finished candidates exist. Default false.
    #[serde(alias = "earlyStopping")]
    pub early_stopping: bool,
    /// Sequences returned, `1..=64`; with beam search at most `num_beams`. Default 1.
    #[serde(alias = "numReturnSequences")]
    pub num_return_sequences: usize,
    /// End-of-sequence token ids that replace the model's (a number or a list; empty: the
    /// model's own). Default empty.
    #[serde(alias = "eosTokenId", deserialize_with = "one_or_many")]
    pub eos_token_id: Vec<u32>,
    /// Keep generating past end-of-sequence and end-of-turn tokens (the stop strings and
    /// `stop_token_ids` still stop): for benchmarks and tests. Default false.
    #[serde(alias = "ignoreEos")]
    pub ignore_eos: bool,
}

/// A token id or a list of them (`eos_token_id: 2` and `eos_token_id: [2, 7]` alike).
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(u32),
        Many(Vec<u32>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(id) => vec![id],
        OneOrMany::Many(ids) => ids,
    })
}

/// Tokens generated after the prompt unless [`SamplingParams::max_new_tokens`] says otherwise.
pub const DEFAULT_MAX_NEW_TOKENS: usize = 100;

/// The one default sampling set of the library, the CLI, the JavaScript API and the chat page:
/// the `balanced` preset (temperature 0.8, top-k 50, top-p 0.9), no penalties, and
/// [`DEFAULT_MAX_NEW_TOKENS`] new tokens. Small models ramble and repeat themselves from the
/// long tail of their distribution at temperature 1; cutting that tail keeps their text on
/// topic while still varying from run to run. [`SamplingParams::unfiltered`] is the model's
/// own distribution (OpenAI's defaults).
impl Default for SamplingParams {
    fn default() -> Self {
        let (temperature, top_k, top_p) = Preset::Balanced.values();
        SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p: 0.0,
            typical_p: 1.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 0,
            logit_bias: BTreeMap::new(),
            seed: None,
            max_new_tokens: DEFAULT_MAX_NEW_TOKENS,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            num_beams: 1,
            length_penalty: 1.0,
            early_stopping: false,
            num_return_sequences: 1,
            eos_token_id: Vec::new(),
            ignore_eos: false,
        }
    }
}

/// Every field name with its camelCase alias (the same name when there is none); used to name
/// the field in JSON errors. Kept in step with the struct by a unit test.
const FIELDS: [(&str, &str); 20] = [
    ("temperature", "temperature"),
    ("top_k", "topK"),
    ("top_p", "topP"),
    ("min_p", "minP"),
    ("typical_p", "typicalP"),
    ("repetition_penalty", "repetitionPenalty"),
    ("presence_penalty", "presencePenalty"),
    ("frequency_penalty", "frequencyPenalty"),
    ("penalty_last_n", "penaltyLastN"),
    ("logit_bias", "logitBias"),
    ("seed", "seed"),
    ("max_new_tokens", "maxNewTokens"),
    ("stop", "stop"),
    ("stop_token_ids", "stopTokenIds"),
    ("num_beams", "numBeams"),
    ("length_penalty", "lengthPenalty"),
    ("early_stopping", "earlyStopping"),
    ("num_return_sequences", "numReturnSequences"),
    ("eos_token_id", "eosTokenId"),
    ("ignore_eos", "ignoreEos"),
];

/// The name reported for errors about the JSON document as a whole (syntax, unknown fields).
const JSON_NAME: &str = "sampling_params";

fn check_range(name: &'static str, value: f32, lo: f32, hi: f32, range: &str) -> Result<()> {
    // NaN is outside every range.
    if (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(Error::invalid(
            name,
            format!("must be in {range}, got {value}"),
        ))
    }
}

fn check_unit_open_closed(name: &'static str, value: f32) -> Result<()> {
    if value > 0.0 && value <= 1.0 {
        Ok(())
    } else {
        Err(Error::invalid(
            name,
            format!("must be in (0, 1], got {value}"),
        ))
    }
}

fn check_count(name: &'static str, value: usize, lo: usize, hi: usize) -> Result<()> {
    if (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(Error::invalid(
            name,
            format!("must be in {lo}..={hi}, got {value}"),
        ))
    }
}

impl SamplingParams {
    /// Greedy decoding (temperature 0, no filters), otherwise the defaults.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::unfiltered()
        }
    }

    /// Temperature 1 over the whole vocabulary (no top-k or top-p), otherwise the defaults: a
    /// draw from the model's own distribution, as OpenAI's API defaults to.
    pub fn unfiltered() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            ..SamplingParams::default()
        }
    }

    /// Sets the preset's temperature, top-k and top-p.
    pub fn apply_preset(&mut self, preset: Preset) {
        (self.temperature, self.top_k, self.top_p) = preset.values();
    }

    /// Checks every range; the error names the parameter (the snake_case field name) and the
    /// allowed range and the given value.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::invalid(
                "temperature",
                format!("must be finite and >= 0, got {}", self.temperature),
            ));
        }
        check_unit_open_closed("top_p", self.top_p)?;
        check_range("min_p", self.min_p, 0.0, 1.0, "[0, 1]")?;
        check_unit_open_closed("typical_p", self.typical_p)?;
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(Error::invalid(
                "repetition_penalty",
                format!("must be finite and > 0, got {}", self.repetition_penalty),
            ));
        }
        check_range(
            "presence_penalty",
            self.presence_penalty,
            -MAX_OPENAI_PENALTY,
            MAX_OPENAI_PENALTY,
            "[-2, 2]",
        )?;
        check_range(
            "frequency_penalty",
            self.frequency_penalty,
            -MAX_OPENAI_PENALTY,
            MAX_OPENAI_PENALTY,
            "[-2, 2]",
        )?;
        for (&id, &bias) in &self.logit_bias {
            if !(-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(&bias) {
                return Err(Error::invalid(
                    "logit_bias",
                    format!("bias for token {id} must be finite and in [-100, 100], got {bias}"),
                ));
            }
        }
        if self.stop.len() > MAX_STOP_STRINGS {
            return Err(Error::invalid(
                "stop",
                format!(
                    "at most {MAX_STOP_STRINGS} stop strings are allowed, got {}",
                    self.stop.len()
                ),
            ));
        }
        if let Some(i) = self.stop.iter().position(|s| s.is_empty()) {
            return Err(Error::invalid(
                "stop",
                format!("stop strings must be non-empty, got an empty string at index {i}"),
            ));
        }
        check_count("num_beams", self.num_beams, 1, MAX_BEAMS)?;
        if !self.length_penalty.is_finite() {
            return Err(Error::invalid(
                "length_penalty",
                format!("must be finite, got {}", self.length_penalty),
            ));
        }
        check_count(
            "num_return_sequences",
            self.num_return_sequences,
            1,
            MAX_RETURN_SEQUENCES,
        )?;
        if self.num_beams > 1 && self.num_return_sequences > self.num_beams {
            return Err(Error::invalid(
                "num_return_sequences",
                format!(
                    "must be <= num_beams ({}) when num_beams > 1, got {}",
                    self.num_beams, self.num_return_sequences
                ),
            ));
        }
        Ok(())
    }

    /// validate() plus ids in logit_bias / stop_token_ids < vocab_size.
    pub fn validate_for_vocab(&self, vocab_size: usize) -> Result<()> {
        self.validate()?;
        let in_vocab = |id: u32| usize::try_from(id).is_ok_and(|id| id < vocab_size);
        if let Some(&id) = self.logit_bias.keys().find(|&&id| !in_vocab(id)) {
            return Err(Error::invalid(
                "logit_bias",
                format!("token id must be in 0..{vocab_size} (the vocabulary), got {id}"),
            ));
        }
        for (name, ids) in [
            ("stop_token_ids", &self.stop_token_ids),
            ("eos_token_id", &self.eos_token_id),
        ] {
            if let Some(&id) = ids.iter().find(|&&id| !in_vocab(id)) {
                return Err(Error::invalid(
                    name,
                    format!("token id must be in 0..{vocab_size} (the vocabulary), got {id}"),
                ));
            }
        }
        Ok(())
    }

    /// Parses JSON (snake_case names or the camelCase aliases), then validate(). A wrong type
    /// gives an error named after the field; unknown fields, a field given under both of its
    /// names, and input that is not a JSON object give an error named `sampling_params` whose
    /// message quotes the offending key. `preset` (a [`Preset`] name) sets temperature, top-k
    /// and top-p where the object does not. Never panics, whatever the input.
    pub fn from_json(json: &str) -> Result<Self> {
        let value: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| Error::invalid(JSON_NAME, format!("not valid JSON: {e}")))?;
        let serde_json::Value::Object(mut map) = value else {
            return Err(Error::invalid(
                JSON_NAME,
                format!("expected a JSON object, got {}", json_kind(&value)),
            ));
        };
        let preset = match map.remove("preset") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(name)) => Some(name.parse::<Preset>()?),
            Some(other) => {
                return Err(Error::invalid(
                    "preset",
                    format!("must be a string, got {}", json_kind(&other)),
                ))
            }
        };
        // Check field by field first so that an error names the field it is about.
        for (key, field_value) in &map {
            let Some(&(name, _)) = FIELDS.iter().find(|(n, a)| key == n || key == a) else {
                return Err(Error::invalid(
                    JSON_NAME,
                    format!(
                        "unknown field `{key}`; expected one of: {}",
                        FIELDS.map(|(n, _)| n).join(", ")
                    ),
                ));
            };
            let mut single = serde_json::Map::new();
            single.insert(key.clone(), field_value.clone());
            if let Err(e) =
                serde_json::from_value::<SamplingParams>(serde_json::Value::Object(single))
            {
                return Err(Error::invalid(name, format!("`{key}`: {e}")));
            }
        }
        // The whole object: catches a field given under both of its names.
        let given = |field: &str| {
            FIELDS
                .iter()
                .any(|(n, a)| *n == field && (map.contains_key(*n) || map.contains_key(*a)))
        };
        let explicit = [given("temperature"), given("top_k"), given("top_p")];
        let mut params: SamplingParams = serde_json::from_value(serde_json::Value::Object(map))
            .map_err(|e| Error::invalid(JSON_NAME, e.to_string()))?;
        if let Some(preset) = preset {
            let (t, k, p) = preset.values();
            if !explicit[0] {
                params.temperature = t;
            }
            if !explicit[1] {
                params.top_k = k;
            }
            if !explicit[2] {
                params.top_p = p;
            }
        }
        params.validate()?;
        Ok(params)
    }

    /// True when sampling is deterministic argmax: temperature == 0, or top_k == 1.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_table_matches_struct() {
        // Every name and alias in the table is accepted on its own by the derived parser, and
        // the table lists every serialized field.
        let defaults = serde_json::to_value(SamplingParams::default()).unwrap_or_default();
        let serialized = defaults.as_object().cloned().unwrap_or_default();
        assert_eq!(serialized.len(), FIELDS.len());
        for (name, alias) in FIELDS {
            let value = serialized.get(name).cloned();
            assert!(value.is_some(), "`{name}` is not a field");
            for key in [name, alias] {
                let mut single = serde_json::Map::new();
                single.insert(key.to_string(), value.clone().unwrap_or_default());
                let parsed = serde_json::from_value::<SamplingParams>(single.into());
                assert!(parsed.is_ok(), "`{key}` rejected: {parsed:?}");
            }
        }
    }

    #[test]
    fn eos_token_id_is_one_or_many() {
        let p = SamplingParams::from_json(r#"{"eos_token_id": 7, "ignoreEos": true}"#)
            .unwrap_or_default();
        assert_eq!((p.eos_token_id, p.ignore_eos), (vec![7], true));
        let p = SamplingParams::from_json(r#"{"eosTokenId": [2, 9]}"#).unwrap_or_default();
        assert_eq!(p.eos_token_id, vec![2, 9]);
        let err = SamplingParams::from_json(r#"{"eos_token_id": "x"}"#).unwrap_err();
        assert!(err.to_string().contains("eos_token_id"), "{err}");
        let big = SamplingParams {
            eos_token_id: vec![100],
            ..SamplingParams::default()
        };
        assert!(big
            .validate_for_vocab(50)
            .unwrap_err()
            .to_string()
            .contains("eos_token_id"));
    }

    #[test]
    fn presets_set_what_is_not_given() {
        let p = SamplingParams::from_json(r#"{"preset": "balanced"}"#).unwrap_or_default();
        assert_eq!((p.temperature, p.top_k, p.top_p), (0.8, 50, 0.9));
        let p =
            SamplingParams::from_json(r#"{"preset": "Creative", "topK": 7}"#).unwrap_or_default();
        assert_eq!((p.temperature, p.top_k, p.top_p), (1.3, 7, 0.95));
        let err = SamplingParams::from_json(r#"{"preset": "wild"}"#).unwrap_err();
        assert!(err.to_string().contains("preset"), "{err}");
        let err = SamplingParams::from_json(r#"{"preset": 3}"#).unwrap_err();
        assert!(err.to_string().contains("preset"), "{err}");
        let mut q = SamplingParams::default();
        q.apply_preset(Preset::Conservative);
        assert_eq!((q.temperature, q.top_k, q.top_p), (0.3, 20, 1.0));
    }

    #[test]
    fn greedy_is_greedy() {
        assert!(SamplingParams::greedy().is_greedy());
        assert!(!SamplingParams::default().is_greedy());
        let top1 = SamplingParams {
            top_k: 1,
            ..SamplingParams::default()
        };
        assert!(top1.is_greedy());
    }

    #[test]
    fn drawn_seeds_fit_a_javascript_number() {
        for _ in 0..64 {
            let seed = draw_seed().unwrap_or(u64::MAX);
            assert!(seed <= MAX_DRAWN_SEED, "{seed}");
        }
        // A sampler without a seed reports the one it drew, within the same range.
        let sampler = crate::sampling::Sampler::new(&SamplingParams::default(), 8);
        let seed = sampler.map(|s| s.seed()).unwrap_or(u64::MAX);
        assert!(seed <= MAX_DRAWN_SEED, "{seed}");
    }
}
