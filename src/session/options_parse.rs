//! Generation options read once. Every surface (the page's `generate`, `stream` and
//! `generateBatch`, the server's requests, batch files) hands its options object to
//! [`GivenOptions`], which resolves each key through the table ([`super::generate_keys`]):
//! any spelling of a known key, an unknown key refused naming the nearest known one, a key
//! given twice refused. [`GivenOptions::apply`] then turns the values into
//! [`GenerateOptions`] fields, checking only their types; the ranges are checked once, by
//! [`GenerateOptions::check`], where the session starts the call.

use serde_json::{Map, Value};

use super::generate_keys::{Key, KEYS};
use super::{GenerateOptions, SpecOptions};
use crate::constrain::ResponseFormat;
use crate::error::{Error, Result};
use crate::option_keys;
use crate::sampling::Preset;

/// Generation options as given: each key resolved to its table entry, with the spelling the
/// caller used (for errors) and its value. `null` values are left out (the default).
#[derive(Clone, Debug, Default)]
pub struct GivenOptions {
    entries: Vec<(&'static Key, String, Value)>,
}

/// The error for an options document as a whole.
fn whole(message: impl Into<String>) -> Error {
    Error::invalid("options", message)
}

impl GivenOptions {
    /// Resolves the keys of `value`: an object of options, or `null` (none).
    pub fn from_value(value: &Value) -> Result<Self> {
        match value {
            Value::Null => Ok(Self::default()),
            Value::Object(map) => Self::from_map(map),
            other => Err(whole(format!(
                "expected an object of generation options, got {}",
                kind(other)
            ))),
        }
    }

    /// Resolves the keys of an object of options.
    pub fn from_map(map: &Map<String, Value>) -> Result<Self> {
        let mut out = Self::default();
        for (spelled, v) in map {
            out.insert(spelled, v.clone())?;
        }
        Ok(out)
    }

    fn insert(&mut self, spelled: &str, v: Value) -> Result<()> {
        let Some(key) = option_keys::find(KEYS, spelled) else {
            let hint = option_keys::nearest(KEYS, spelled)
                .map(|n| format!("; did you mean `{n}`?"))
                .unwrap_or_default();
            return Err(whole(format!(
                "unknown generation option `{spelled}`{hint}"
            )));
        };
        if let Some((_, first, _)) = self.entries.iter().find(|(k, _, _)| k.name == key.name) {
            return Err(whole(format!(
                "`{}` given twice, as `{first}` and as `{spelled}`",
                key.name
            )));
        }
        if !v.is_null() {
            self.entries.push((key, spelled.to_string(), v));
        }
        Ok(())
    }

    /// These options over `base`: a key given here replaces the same key there, in whatever
    /// spelling either was written.
    pub fn over(self, base: &GivenOptions) -> GivenOptions {
        let mut entries: Vec<_> = base
            .entries
            .iter()
            .filter(|(k, _, _)| !self.has(k.name))
            .cloned()
            .collect();
        entries.extend(self.entries);
        GivenOptions { entries }
    }

    /// Whether the key named `name` (its table name) was given.
    pub fn has(&self, name: &str) -> bool {
        self.entries.iter().any(|(k, _, _)| k.name == name)
    }

    /// Whether no option was given.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Sets the given options on `options`, in three steps: `preset` first (so that the
    /// temperature, top-k and top-p given beside it win), then every other key, then
    /// `doSample` and the flat `spec*` settings, which read the others. Checks types only.
    pub fn apply(&self, options: &mut GenerateOptions) -> Result<()> {
        let mut flat_spec = Map::new();
        let mut do_sample = None;
        for (key, spelled, v) in &self.entries {
            let v = Val { spelled, v };
            match key.name {
                "preset" => options
                    .sampling
                    .apply_preset(v.text("preset")?.parse::<Preset>()?),
                "doSample" => do_sample = Some(v.flag("do_sample")?),
                "specSource" => _ = flat_spec.insert("method".into(), v.v.clone()),
                "specK" => _ = flat_spec.insert("k".into(), v.v.clone()),
                "specKAdaptive" => _ = flat_spec.insert("adaptive".into(), v.v.clone()),
                "specExtraToken" => _ = flat_spec.insert("extra_token".into(), v.v.clone()),
                "specDisableBelowAccept" => {
                    _ = flat_spec.insert("disable_below_accept".into(), v.v.clone())
                }
                "specMethod" => _ = flat_spec.insert("spec_method".into(), v.v.clone()),
                _ => {}
            }
        }
        for (key, spelled, v) in &self.entries {
            set(options, key.name, &Val { spelled, v })?;
        }
        match do_sample {
            Some(false) => options.sampling.temperature = 0.0,
            Some(true) if options.sampling.temperature == 0.0 => {
                return Err(Error::invalid(
                    "do_sample",
                    "sampling needs a temperature above 0 (temperature, or a preset)",
                ))
            }
            _ => {}
        }
        if !flat_spec.is_empty() {
            self.apply_flat_spec(options, flat_spec)?;
        }
        Ok(())
    }

    /// The flat `spec*` settings: speculative decoding on with them (with the defaults, or
    /// over the `speculative` object given beside them).
    fn apply_flat_spec(
        &self,
        options: &mut GenerateOptions,
        flat: Map<String, Value>,
    ) -> Result<()> {
        let nested = self
            .entries
            .iter()
            .find(|(k, _, _)| k.name == "speculative")
            .map(|(_, _, v)| v);
        let mut merged = match nested {
            None | Some(Value::Bool(true)) => Map::new(),
            Some(Value::Object(map)) => map.clone(),
            Some(_) => return Err(Error::invalid(
                "speculative",
                "`speculative` is off but speculative settings (spec_k, ...) are given beside it",
            )),
        };
        for (name, v) in flat {
            if merged
                .keys()
                .any(|k| SpecOptions::setting(k) == SpecOptions::setting(&name))
            {
                return Err(Error::invalid(
                    "speculative",
                    format!("`{name}` given twice, flat and inside `speculative`"),
                ));
            }
            merged.insert(name, v);
        }
        options.speculative = SpecOptions::from_json(&Value::Object(merged))?;
        Ok(())
    }
}

impl GenerateOptions {
    /// Reads one options value (an object in any documented spelling, or `null` for the
    /// defaults) into options, checking types; see [`GivenOptions`]. The ranges are checked by
    /// [`GenerateOptions::check`] when the call starts.
    pub fn from_value(value: &Value) -> Result<Self> {
        let mut options = GenerateOptions::default();
        GivenOptions::from_value(value)?.apply(&mut options)?;
        Ok(options)
    }

    /// [`GenerateOptions::from_value`] of JSON text.
    pub fn from_json(json: &str) -> Result<Self> {
        let value: Value =
            serde_json::from_str(json).map_err(|e| whole(format!("not valid JSON: {e}")))?;
        Self::from_value(&value)
    }
}

/// One given value with the spelling it came under, read as the field's type; errors name
/// the option (`name`, its snake_case form) and quote the spelling and the value.
struct Val<'a> {
    spelled: &'a str,
    v: &'a Value,
}

impl Val<'_> {
    fn wrong(&self, name: &'static str, what: &str) -> Error {
        Error::invalid(
            name,
            format!("`{}` must be {what}, got {}", self.spelled, self.v),
        )
    }

    fn f32(&self, name: &'static str) -> Result<f32> {
        // a finite f64 beyond f32's range becomes infinite, which the range check refuses
        self.v
            .as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| self.wrong(name, "a number"))
    }

    fn u64(&self, name: &'static str) -> Result<u64> {
        self.v
            .as_u64()
            .ok_or_else(|| self.wrong(name, "a whole number >= 0"))
    }

    fn whole(&self, name: &'static str) -> Result<usize> {
        self.u64(name)
            .and_then(|n| usize::try_from(n).map_err(|_| self.wrong(name, "a smaller number")))
    }

    fn flag(&self, name: &'static str) -> Result<bool> {
        self.v
            .as_bool()
            .ok_or_else(|| self.wrong(name, "true or false"))
    }

    fn text(&self, name: &'static str) -> Result<&str> {
        self.v.as_str().ok_or_else(|| self.wrong(name, "a string"))
    }

    fn id(&self, name: &'static str, v: &Value) -> Result<u32> {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| self.wrong(name, "token ids (whole numbers below 2^32)"))
    }

    fn ids(&self, name: &'static str) -> Result<Vec<u32>> {
        match self.v {
            Value::Array(items) => items.iter().map(|v| self.id(name, v)).collect(),
            _ => Err(self.wrong(name, "an array of token ids")),
        }
    }

    fn one_or_many_ids(&self, name: &'static str) -> Result<Vec<u32>> {
        match self.v {
            Value::Array(_) => self.ids(name),
            v => Ok(vec![self.id(name, v)?]),
        }
    }

    fn strings(&self, name: &'static str) -> Result<Vec<String>> {
        let bad = || self.wrong(name, "a string or an array of strings");
        match self.v {
            Value::String(s) => Ok(vec![s.clone()]),
            Value::Array(items) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string).ok_or_else(bad))
                .collect(),
            _ => Err(bad()),
        }
    }

    fn bias(&self, name: &'static str) -> Result<std::collections::BTreeMap<u32, f32>> {
        let Value::Object(map) = self.v else {
            return Err(self.wrong(name, "an object of token id to bias"));
        };
        map.iter()
            .map(|(id, bias)| {
                let id = id.trim().parse::<u32>().map_err(|_| {
                    self.wrong(name, "an object whose keys are token ids (whole numbers)")
                })?;
                let bias = bias
                    .as_f64()
                    .ok_or_else(|| self.wrong(name, "an object whose values are numbers"))?;
                Ok((id, bias as f32))
            })
            .collect()
    }
}

/// Sets the field of key `name` (its table name) from `v`. `preset`, `doSample` and the flat
/// speculative settings are [`GivenOptions::apply`]'s.
fn set(o: &mut GenerateOptions, name: &str, v: &Val) -> Result<()> {
    let s = &mut o.sampling;
    match name {
        "maxNewTokens" => s.max_new_tokens = v.whole("max_new_tokens")?,
        "temperature" => s.temperature = v.f32("temperature")?,
        "topK" => s.top_k = v.whole("top_k")?,
        "topP" => s.top_p = v.f32("top_p")?,
        "minP" => s.min_p = v.f32("min_p")?,
        "typicalP" => s.typical_p = v.f32("typical_p")?,
        "repetitionPenalty" => s.repetition_penalty = v.f32("repetition_penalty")?,
        "presencePenalty" => s.presence_penalty = v.f32("presence_penalty")?,
        "frequencyPenalty" => s.frequency_penalty = v.f32("frequency_penalty")?,
        "penaltyLastN" => s.penalty_last_n = v.whole("penalty_last_n")?,
        "logitBias" => s.logit_bias = v.bias("logit_bias")?,
        "seed" => s.seed = Some(v.u64("seed")?),
        "stop" => s.stop = v.strings("stop")?,
        "stopTokenIds" => s.stop_token_ids = v.ids("stop_token_ids")?,
        "numBeams" => s.num_beams = v.whole("num_beams")?,
        "lengthPenalty" => s.length_penalty = v.f32("length_penalty")?,
        "earlyStopping" => s.early_stopping = v.flag("early_stopping")?,
        "numReturnSequences" => s.num_return_sequences = v.whole("num_return_sequences")?,
        "eosTokenId" => s.eos_token_id = v.one_or_many_ids("eos_token_id")?,
        "ignoreEos" => s.ignore_eos = v.flag("ignore_eos")?,
        "special" => o.special = v.flag("special")?,
        "strict" => o.strict = v.flag("strict")?,
        "useCache" => o.no_kv_cache = !v.flag("use_cache")?,
        "echo" => o.echo = v.flag("echo")?,
        "nKeep" => o.n_keep = Some(v.whole("n_keep")?),
        "speculative" => o.speculative = SpecOptions::from_json(v.v)?,
        "responseFormat" => o.response_format = ResponseFormat::from_value(v.v)?,
        "topLogprobs" => o.top_logprobs = v.whole("top_logprobs")?,
        // read by `GivenOptions::apply` before and after the others
        "preset"
        | "doSample"
        | "specSource"
        | "specK"
        | "specKAdaptive"
        | "specExtraToken"
        | "specDisableBelowAccept"
        | "specMethod" => {}
        other => {
            return Err(whole(format!(
                "`{other}` is in the table of generation options but has no field"
            )))
        }
    }
    Ok(())
}

/// What kind of JSON value `v` is, for errors.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::option_keys::normalized;
    use crate::session::generate_keys::typescript;
    use crate::session::SpecSource;

    fn parse(json: &str) -> Result<GenerateOptions> {
        GenerateOptions::from_json(json)
    }

    fn message(r: Result<GenerateOptions>) -> String {
        match r {
            Err(e) => e.to_string(),
            Ok(o) => format!("accepted: {o:?}"),
        }
    }

    fn name(r: Result<GenerateOptions>) -> Option<&'static str> {
        match r {
            Err(Error::InvalidArgument { name, .. }) => Some(name),
            _ => None,
        }
    }

    #[test]
    fn call_options_and_sampling_come_from_one_object() {
        let o = parse(r#"{"topP": 0.5, "max_new_tokens": 3, "special": true, "nKeep": 2, "strict": true, "use_cache": false, "echo": true, "topLogprobs": 2}"#)
            .unwrap_or_default();
        assert_eq!((o.sampling.top_p, o.sampling.max_new_tokens), (0.5, 3));
        assert!(o.special && o.strict && o.no_kv_cache && o.echo);
        assert_eq!((o.n_keep, o.top_logprobs), (Some(2), 2));
        for defaults in ["null", "{}", r#"{"temperature": null}"#] {
            assert_eq!(
                parse(defaults).ok(),
                Some(GenerateOptions::default()),
                "{defaults}"
            );
        }
    }

    #[test]
    fn unknown_twice_and_mistyped_options_are_named() {
        let m = message(parse(r#"{"temprature": 0.5}"#));
        assert!(
            m.contains("`temprature`") && m.contains("`temperature`"),
            "{m}"
        );
        let m = message(parse(r#"{"bogus": 1}"#));
        assert!(
            m.contains("unknown generation option `bogus`") && !m.contains("did you mean"),
            "{m}"
        );
        let m = message(parse(r#"{"n_keep": 1, "nKeep": 1}"#));
        assert!(
            m.contains("`n_keep`") && m.contains("`nKeep`") && m.contains("twice"),
            "{m}"
        );
        assert_eq!(name(parse(r#"{"special": 1}"#)), Some("special"));
        assert_eq!(name(parse(r#"{"nKeep": -1}"#)), Some("n_keep"));
        assert_eq!(name(parse(r#"{"seed": 1.5}"#)), Some("seed"));
        assert_eq!(name(parse(r#"{"preset": "wild"}"#)), Some("preset"));
        assert_eq!(name(parse("[1]")), Some("options"));
        // ranges are the call's check, not the reading's
        let wide = parse(r#"{"topP": 1.5, "topLogprobs": 21}"#);
        assert_eq!(wide.as_ref().ok().map(|o| o.sampling.top_p), Some(1.5));
        let checked = wide.and_then(|o| o.check(10).map(|_| o));
        assert_eq!(name(checked), Some("top_p"));
        let logprobs = parse(r#"{"topLogprobs": 21}"#).and_then(|o| o.validate().map(|()| o));
        assert_eq!(name(logprobs), Some("top_logprobs"));
    }

    #[test]
    fn preset_and_do_sample_read_the_keys_beside_them() {
        let o = parse(r#"{"preset": "creative", "topK": 7}"#).unwrap_or_default();
        assert_eq!(
            (o.sampling.temperature, o.sampling.top_k, o.sampling.top_p),
            (1.3, 7, 0.95)
        );
        // the explicit key wins whatever order the object lists them in
        let o = parse(r#"{"temperature": 0.2, "preset": "creative"}"#).unwrap_or_default();
        assert_eq!(o.sampling.temperature, 0.2);
        let o = parse(r#"{"do_sample": false, "temperature": 0.9}"#).unwrap_or_default();
        assert!(o.sampling.is_greedy());
        assert_eq!(
            name(parse(r#"{"doSample": true, "temperature": 0}"#)),
            Some("do_sample")
        );
        assert!(parse(r#"{"doSample": true}"#).is_ok());
    }

    #[test]
    fn flat_speculative_settings_turn_it_on() {
        let o = parse(r#"{"spec_k": 6, "specSource": "lookup", "spec_k_adaptive": true}"#)
            .unwrap_or_default();
        let spec = o.speculative.unwrap_or_default();
        assert_eq!(
            (spec.k, spec.source, spec.adaptive),
            (6, Some(SpecSource::Lookup), true)
        );
        let o =
            parse(r#"{"speculative": {"k": 3}, "spec_extra_token": false}"#).unwrap_or_default();
        let spec = o.speculative.unwrap_or_default();
        assert_eq!((spec.k, spec.extra_token), (3, false));
        let m = message(parse(r#"{"speculative": {"k": 3}, "specK": 5}"#));
        assert!(m.contains("twice"), "{m}");
        let m = message(parse(r#"{"speculative": false, "specK": 5}"#));
        assert!(m.contains("off"), "{m}");
        assert_eq!(
            name(parse(r#"{"spec_method": "typical"}"#)),
            Some("spec_method")
        );
        let k = parse(r#"{"specK": 0}"#).and_then(|o| o.validate().map(|()| o));
        assert_eq!(name(k), Some("spec_k"));
    }

    #[test]
    fn given_options_replace_the_same_key_in_any_spelling() {
        let base = GivenOptions::from_value(&serde_json::json!({"max_new_tokens": 9, "topK": 3}));
        let own = GivenOptions::from_value(&serde_json::json!({"maxNewTokens": 2}));
        let (Ok(base), Ok(own)) = (base, own) else {
            panic!("options refused");
        };
        let mut o = GenerateOptions::default();
        assert!(own.over(&base).apply(&mut o).is_ok());
        assert_eq!((o.sampling.max_new_tokens, o.sampling.top_k), (2, 3));
    }

    /// Every key of the table sets something: a value of the wrong type is refused naming it.
    #[test]
    fn every_key_of_the_table_is_read() {
        let mut seen = std::collections::BTreeSet::new();
        for k in KEYS {
            for form in std::iter::once(k.name).chain(k.aliases.iter().copied()) {
                assert!(seen.insert(normalized(form)), "{form} twice");
            }
            let mut map = Map::new();
            map.insert(
                k.name.to_string(),
                serde_json::json!({"no": ["such", "value"]}),
            );
            let m = message(GenerateOptions::from_value(&Value::Object(map)));
            assert!(
                !m.contains("has no field") && !m.starts_with("accepted"),
                "{}: {m}",
                k.name
            );
        }
    }

    /// The TypeScript interface in the package's types is the one the table makes.
    #[test]
    fn the_typescript_interface_is_the_tables() {
        let ts = typescript();
        assert!(
            include_str!("../web/typescript_options.rs").contains(&ts),
            "src/web/typescript_options.rs's GenerateOptions differs from the table; it should read:\n{ts}"
        );
    }

    /// Prints the generated interface (`cargo test --lib print_generate_options_typescript --
    /// --ignored --nocapture`), to paste into `src/web/typescript_options.rs` after changing the table.
    #[test]
    #[ignore]
    fn print_generate_options_typescript() {
        print!("{}", typescript());
    }
}
