//! The options a model is loaded with, read once on every surface: the page's `Engine.load`
//! object, the command line's flags, `serve-api`'s and a `--config` file (JSON) all become one
//! [`LoadOptions`], checked key by key against [`super::load_keys`] (every documented spelling
//! accepted, an unknown key refused naming the nearest known one, a key that has no meaning on
//! this surface refused saying why), then validated once by [`LoadOptions::resolve`] into the
//! [`EngineOptions`] the layers below trust.

use std::collections::BTreeMap;

use serde_json::Value;

use super::load_keys::{self, Key, Kind, Scope};
use super::EngineOptions;
use crate::backend::cpu::CpuPrecision;
use crate::backend::gpu::{
    DecodePlan, DecodePlanMode, DeviceChoice, GpuOptions, KernelOverrides, Precision,
};
use crate::dtype::kv::{KvKind, KvKinds};
use crate::error::{Error, Result};
use crate::session::CachePlanOptions;

/// Where options come from: it decides which keys apply and how a key is named in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// `Engine.load` in a page (camelCase).
    Page,
    /// The command line's flags (`--kv-cache`).
    Cli,
    /// A settings file or a JSON body, natively (camelCase).
    File,
}

impl Surface {
    fn native(self) -> bool {
        self != Surface::Page
    }

    /// How `key` is written on this surface when the caller did not write it.
    fn spell(self, key: &Key) -> String {
        match self {
            Surface::Cli => format!("--{}", load_keys::words(key.name, '-')),
            Surface::Page | Surface::File => key.name.to_string(),
        }
    }
}

/// One key's value as given.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    /// A string.
    Text(String),
    /// A finite number.
    Number(f64),
    /// A whole number.
    Whole(u64),
    /// A flag.
    Flag(bool),
}

#[derive(Debug, Clone, PartialEq)]
struct Given {
    value: OptionValue,
    /// The key as the caller wrote it (`cache_kind`, `--kv-cache`), for messages.
    spelled: String,
}

/// Load options as given on one surface, every key known and of the right type (see the
/// [module documentation](self)); [`LoadOptions::resolve`] checks how they combine.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadOptions {
    surface: Surface,
    /// By the key's camelCase name.
    given: BTreeMap<&'static str, Given>,
}

/// An invalid-argument error naming `key` (as the caller wrote it, when that differs).
fn invalid(key: &Key, spelled: &str, message: impl std::fmt::Display) -> Error {
    if spelled == key.name {
        Error::invalid(key.name, message.to_string())
    } else {
        Error::invalid(key.name, format!("(written `{spelled}`) {message}"))
    }
}

impl LoadOptions {
    /// No options: every default.
    pub fn new(surface: Surface) -> Self {
        Self {
            surface,
            given: BTreeMap::new(),
        }
    }

    /// The options of a JSON object (`null` is no options); `null` values count as not given.
    pub fn from_json(value: &Value, surface: Surface) -> Result<Self> {
        let mut options = Self::new(surface);
        match value {
            Value::Null => {}
            Value::Object(map) => {
                for (key, v) in map {
                    options.set_json(key, v)?;
                }
            }
            other => {
                return Err(Error::invalid(
                    "options",
                    format!("load options must be an object, got {other}"),
                ))
            }
        }
        Ok(options)
    }

    /// The options of a settings file's text (JSON); `path` names it in errors.
    pub fn from_file_text(text: &str, path: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(text).map_err(|e| {
            Error::invalid(
                "config",
                format!("{path}: not a JSON object of load options: {e}"),
            )
        })?;
        Self::from_json(&value, Surface::File).map_err(|e| match e {
            Error::InvalidArgument { name, message } => {
                Error::invalid(name, format!("{path}: {message}"))
            }
            e => e,
        })
    }

    /// The key `spelled` is known on this surface: its table entry, or why not.
    fn key(&self, spelled: &str) -> Result<&'static Key> {
        let Some(key) = load_keys::find(spelled) else {
            let hint = load_keys::nearest(spelled)
                .map(|n| {
                    let key = load_keys::find(n).map(|k| self.surface.spell(k));
                    format!("; did you mean `{}`?", key.unwrap_or_else(|| n.to_string()))
                })
                .unwrap_or_default();
            return Err(Error::invalid(
                "options",
                format!("unknown load option `{spelled}`{hint}"),
            ));
        };
        match key.scope {
            Scope::Page(why) if self.surface.native() => Err(invalid(
                key,
                spelled,
                format!("is an option of Engine.load in a page: {why}"),
            )),
            Scope::Native(why) if !self.surface.native() => Err(invalid(
                key,
                spelled,
                format!("has no meaning in a page: {why}"),
            )),
            _ => Ok(key),
        }
    }

    /// Whether `spelled` names a key the surface passes as a JavaScript value (`onProgress`,
    /// `draft`), and which.
    pub fn js_key(spelled: &str) -> Option<&'static str> {
        load_keys::find(spelled)
            .filter(|k| k.kind == Kind::Js)
            .map(|k| k.name)
    }

    /// The error for a value of `spelled` that is no JSON value (`what`: "a function"): the
    /// key's unknown-key error, or what it must be.
    pub fn refuse(&self, spelled: &str, what: &str) -> Error {
        match self.key(spelled) {
            Err(e) => e,
            Ok(key) => invalid(
                key,
                spelled,
                format!("must be {}, got {what}", expected(key.kind)),
            ),
        }
    }

    /// Sets `spelled` from a JSON value, checked against its kind (`null`: not given).
    pub fn set_json(&mut self, spelled: &str, v: &Value) -> Result<()> {
        let key = self.key(spelled)?;
        // `'auto'` names the default of a key that has one
        if v.is_null() || (key.kind == Kind::WholeOrAuto && v.as_str() == Some("auto")) {
            return Ok(());
        }
        let value = match key.kind {
            Kind::Text => v.as_str().map(|s| OptionValue::Text(s.to_string())),
            Kind::Number => v
                .as_f64()
                .filter(|n| n.is_finite())
                .map(OptionValue::Number),
            Kind::Whole | Kind::WholeOrAuto => v
                .as_u64()
                .or_else(|| {
                    v.as_f64()
                        .filter(|n| n.fract() == 0.0 && *n >= 0.0 && *n <= u32::MAX as f64)
                        .map(|n| n as u64)
                })
                .filter(|n| *n <= u64::from(u32::MAX))
                .map(OptionValue::Whole),
            Kind::Flag => v.as_bool().map(OptionValue::Flag),
            Kind::Js => {
                return Err(invalid(
                    key,
                    spelled,
                    "is a JavaScript value Engine.load takes as it is",
                ))
            }
        };
        let value = value.ok_or_else(|| {
            invalid(
                key,
                spelled,
                format!("must be {}, got {v}", expected(key.kind)),
            )
        })?;
        self.put(key, spelled, value)
    }

    /// Sets `spelled` (a command-line flag's value), with the same checks as a JSON value.
    pub fn set(&mut self, spelled: &str, value: OptionValue) -> Result<()> {
        let json = match value {
            OptionValue::Text(s) => Value::from(s),
            OptionValue::Number(n) => Value::from(n),
            OptionValue::Whole(n) => Value::from(n),
            OptionValue::Flag(b) => Value::from(b),
        };
        self.set_json(spelled, &json)
    }

    fn put(&mut self, key: &'static Key, spelled: &str, value: OptionValue) -> Result<()> {
        if let Some(before) = self.given.get(key.name) {
            if before.spelled != spelled {
                return Err(invalid(
                    key,
                    spelled,
                    format!("is given twice (also as `{}`)", before.spelled),
                ));
            }
        }
        self.given.insert(
            key.name,
            Given {
                value,
                spelled: spelled.to_string(),
            },
        );
        Ok(())
    }

    /// These options with `base`'s for every key not given here (flags over a settings file).
    pub fn over(mut self, base: LoadOptions) -> Self {
        for (name, given) in base.given {
            self.given.entry(name).or_insert(given);
        }
        self
    }

    /// The camelCase names of the keys given.
    pub fn given_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.given.keys().copied()
    }

    /// Whether `name` (camelCase) was given.
    pub fn has(&self, name: &str) -> bool {
        self.given.contains_key(name)
    }

    /// How `name` (camelCase) is named in messages: as written, or as this surface writes it.
    pub fn spelled(&self, name: &str) -> String {
        match (self.given.get(name), load_keys::find(name)) {
            (Some(g), _) => g.spelled.clone(),
            (None, Some(k)) => self.surface.spell(k),
            (None, None) => name.to_string(),
        }
    }

    /// The text of `name`, when given.
    pub fn text(&self, name: &str) -> Option<&str> {
        match self.given.get(name).map(|g| &g.value) {
            Some(OptionValue::Text(s)) => Some(s),
            _ => None,
        }
    }

    fn number(&self, name: &str) -> Option<f64> {
        match self.given.get(name).map(|g| &g.value) {
            Some(OptionValue::Number(n)) => Some(*n),
            Some(OptionValue::Whole(n)) => Some(*n as f64),
            _ => None,
        }
    }

    /// The whole number of `name`, when given.
    pub fn whole(&self, name: &str) -> Option<u64> {
        match self.given.get(name).map(|g| &g.value) {
            Some(OptionValue::Whole(n)) => Some(*n),
            _ => None,
        }
    }

    fn flag(&self, name: &str) -> Option<bool> {
        match self.given.get(name).map(|g| &g.value) {
            Some(OptionValue::Flag(b)) => Some(*b),
            _ => None,
        }
    }

    /// An error about `name` (camelCase), naming it as the caller wrote it.
    fn error(&self, name: &'static str, message: impl std::fmt::Display) -> Error {
        let spelled = self.spelled(name);
        match load_keys::find(name) {
            Some(key) => invalid(key, &spelled, message),
            None => Error::invalid(name, message.to_string()),
        }
    }

    /// Renames the snake_case option names of a lower layer's message to this surface's.
    fn renamed(&self, e: Error, names: &[&'static str]) -> Error {
        let Error::InvalidArgument { name, message } = e else {
            return e;
        };
        let snake = |n: &str| load_keys::words(n, '_');
        // longest names first, so that `decode_plan` does not eat `decode_plan_...`
        let mut by_length: Vec<&'static str> = names.to_vec();
        by_length.sort_by_key(|n| std::cmp::Reverse(n.len()));
        let message = by_length
            .iter()
            .fold(message, |m, n| m.replace(&snake(n), &self.spelled(n)));
        match names.iter().copied().find(|n| snake(n) == name) {
            Some(n) => self.error(n, message),
            None => Error::invalid(name, message),
        }
    }

    /// The options validated into what the engine loads with: every value parsed, every
    /// combination checked (a `kvCache: 'auto'` setting without `auto`, `kCache` with `auto`,
    /// an inconsistent decode plan), each error naming the option as it was written.
    pub fn resolve(&self) -> Result<EngineOptions> {
        let context = match self.whole("contextLength") {
            Some(0) => return Err(self.error("contextLength", "must be at least 1")),
            n => n.map(|n| n as usize),
        };
        let kernels = match self.text("kernels") {
            Some(spec) => spec
                .parse::<KernelOverrides>()
                .map_err(|e| self.error("kernels", e))?,
            None => KernelOverrides::none(),
        };
        let (kv_cache, cache_plan, kv_budget_mb) = self.kv()?;
        let precision = match self.text("precision") {
            Some(s) => s
                .parse()
                .map_err(|e: Error| self.error("precision", strip(e)))?,
            None => Default::default(),
        };
        // f32 asked for by name is exact on the CPU too; left out, the CPU runs 8-bit
        // activations (its speed) and the GPU f32
        let cpu_precision = match (self.text("precision"), precision) {
            (Some(_), Precision::F32) => CpuPrecision::F32,
            _ => CpuPrecision::Int8,
        };
        let device = match self.text("backend") {
            Some(s) => s
                .parse::<DeviceChoice>()
                .map_err(|e| self.error("backend", strip(e)))?,
            None => DeviceChoice::default(),
        };
        Ok(EngineOptions {
            context,
            gpu: GpuOptions {
                kernels,
                kv_cache,
                decode_plan: self.decode_plan()?,
                precision,
                device,
                ..GpuOptions::default()
            },
            cache_plan,
            kv_budget_mb,
            chat_template: self.text("chatTemplate").map(String::from),
            cpu_precision,
        })
    }

    /// The fixed kinds, or the automatic plan's settings, and a fixed kind's budget.
    fn kv(&self) -> Result<(KvKinds, Option<CachePlanOptions>, Option<f64>)> {
        let kind = |name: &'static str| -> Result<Option<KvKind>> {
            self.text(name)
                .map(|s| KvKind::parse(name, s).map_err(|e| self.error(name, strip(e))))
                .transpose()
        };
        let budget = self.number("cacheBudgetMb");
        if let Some(b) = budget.filter(|b| !(b.is_finite() && *b > 0.0)) {
            return Err(self.error(
                "cacheBudgetMb",
                format!("must be a positive number of MiB, got {b}"),
            ));
        }
        let auto = self
            .text("kvCache")
            .is_some_and(|s| s.trim().eq_ignore_ascii_case("auto"));
        let tuning: Vec<&'static str> = load_keys::KEYS
            .iter()
            .filter(|k| k.tunes_auto && self.has(k.name))
            .map(|k| k.name)
            .collect();
        if !auto {
            if let Some(first) = tuning.first() {
                return Err(self.error(
                    "kvCache",
                    format!(
                        "{} tunes {} auto; set {} auto with it",
                        self.spelled(first),
                        self.spelled("kvCache"),
                        self.spelled("kvCache"),
                    ),
                ));
            }
            let both = kind("kvCache")?.unwrap_or_default();
            let kinds = KvKinds {
                k: kind("kCache")?.unwrap_or(both),
                v: kind("vCache")?.unwrap_or(both),
            };
            return Ok((kinds, None, budget));
        }
        for name in ["kCache", "vCache"] {
            if self.has(name) {
                return Err(self.error(
                    name,
                    format!(
                        "cannot be combined with {} auto (the plan chooses one kind for K and V)",
                        self.spelled("kvCache")
                    ),
                ));
            }
        }
        let d = CachePlanOptions::default();
        let whole = |name: &str, default: usize| self.whole(name).map_or(default, |n| n as usize);
        let plan = CachePlanOptions {
            cache_budget_mb: budget,
            cache_quality_prompt_len: whole("cacheQualityPromptLen", d.cache_quality_prompt_len),
            cache_quality_decode_steps: whole(
                "cacheQualityDecodeSteps",
                d.cache_quality_decode_steps,
            ),
            cache_quality_max_delta_nll: self
                .number("cacheQualityMaxDeltaNll")
                .unwrap_or(d.cache_quality_max_delta_nll),
            cache_quality_max_ppl_ratio: self
                .number("cacheQualityMaxPplRatio")
                .unwrap_or(d.cache_quality_max_ppl_ratio),
            cache_quality_max_mean_kl: self
                .number("cacheQualityMaxMeanKl")
                .unwrap_or(d.cache_quality_max_mean_kl),
            cache_auto_benchmark: self
                .flag("cacheAutoBenchmark")
                .unwrap_or(d.cache_auto_benchmark),
            cache_auto_bench_steps: whole("cacheAutoBenchSteps", d.cache_auto_bench_steps),
            cache_auto_bench_prompt_len: whole(
                "cacheAutoBenchPromptLen",
                d.cache_auto_bench_prompt_len,
            ),
            cache_plan_path: self.text("cachePlanPath").map(String::from),
            cache_plan_probe: self.flag("cachePlanProbe").unwrap_or(d.cache_plan_probe),
            cache_plan_probe_interval_sec: self
                .whole("cachePlanProbeIntervalSec")
                .unwrap_or(d.cache_plan_probe_interval_sec),
        };
        let names: Vec<&'static str> = load_keys::KEYS
            .iter()
            .filter(|k| k.tunes_auto || k.name == "cacheBudgetMb")
            .map(|k| k.name)
            .collect();
        plan.validate().map_err(|e| self.renamed(e, &names))?;
        Ok((KvKinds::default(), Some(plan), None))
    }

    /// The decode plan of `decodePlan` and its values.
    fn decode_plan(&self) -> Result<DecodePlan> {
        let d = DecodePlan::default();
        let mode = match self.text("decodePlan") {
            Some(s) => s.parse::<DecodePlanMode>().map_err(|_| {
                self.error(
                    "decodePlan",
                    format!("`{s}` is not 'auto', 'fixed' or 'none'"),
                )
            })?,
            None => d.mode,
        };
        let keys = |name: &str| self.whole(name).map(|n| n as u32);
        let plan = DecodePlan {
            mode,
            q_chunk: keys("decodeQChunk"),
            local_window: keys("decodeLocalWindow"),
            bucket_short: keys("decodeBucketShort").unwrap_or(d.bucket_short),
            bucket_mid: keys("decodeBucketMid").unwrap_or(d.bucket_mid),
        };
        plan.validate().map_err(|e| {
            self.renamed(
                e,
                &[
                    "decodePlan",
                    "decodeQChunk",
                    "decodeLocalWindow",
                    "decodeBucketShort",
                    "decodeBucketMid",
                ],
            )
        })?;
        Ok(plan)
    }
}

/// What a value of `kind` must be, for messages.
fn expected(kind: Kind) -> &'static str {
    match kind {
        Kind::Text => "a string",
        Kind::Number => "a finite number",
        Kind::Whole => "a whole number >= 0",
        Kind::WholeOrAuto => "a whole number >= 0 or 'auto'",
        Kind::Flag => "true or false",
        Kind::Js => "a JavaScript value",
    }
}

/// A lower layer's invalid-argument message without its own name (the caller names the key).
fn strip(e: Error) -> String {
    match e {
        Error::InvalidArgument { message, .. } => message,
        e => e.to_string(),
    }
}

#[cfg(test)]
#[path = "load_options_tests.rs"]
mod tests;
