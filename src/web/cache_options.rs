//! The KV-cache and decode-planning options of `Engine.load`: `kvCache` (a kind, or
//! `'auto'`), `kCache`, `vCache`, the automatic plan's settings in camelCase (`cacheBudgetMb`,
//! ...), `decodePlan` with its values (`decodeQChunk`, ...) and `precision`, each checked by
//! name.

use wasm_bindgen::JsValue;

use super::engine::{load_option, present};
use crate::dtype::kv::KvKinds;
use crate::error::{Error, Result};
use crate::gpu::{DecodePlan, DecodePlanMode, DeviceChoice, Precision};
use crate::session::CachePlanOptions;

fn string(options: &JsValue, key: &'static str) -> Result<Option<String>> {
    let v = load_option(options, key);
    if !present(&v) {
        return Ok(None);
    }
    v.as_string()
        .map(Some)
        .ok_or_else(|| Error::invalid(key, "must be a string"))
}

fn number(options: &JsValue, key: &'static str) -> Result<Option<f64>> {
    let v = load_option(options, key);
    if !present(&v) {
        return Ok(None);
    }
    v.as_f64()
        .filter(|n| n.is_finite())
        .map(Some)
        .ok_or_else(|| Error::invalid(key, format!("must be a finite number, got {v:?}")))
}

fn whole(options: &JsValue, key: &'static str) -> Result<Option<usize>> {
    match number(options, key)? {
        None => Ok(None),
        Some(n) if n.fract() == 0.0 && n >= 0.0 && n <= u32::MAX as f64 => Ok(Some(n as usize)),
        Some(n) => Err(Error::invalid(
            key,
            format!("must be a whole number, got {n}"),
        )),
    }
}

fn boolean(options: &JsValue, key: &'static str) -> Result<Option<bool>> {
    let v = load_option(options, key);
    if !present(&v) {
        return Ok(None);
    }
    v.as_bool()
        .map(Some)
        .ok_or_else(|| Error::invalid(key, "must be true or false"))
}

/// The fixed kinds, and the plan's settings with `kvCache: 'auto'`.
pub(super) fn kv_options(options: &JsValue) -> Result<(KvKinds, Option<CachePlanOptions>)> {
    let kv = string(options, "kvCache")?;
    let (k, v) = (string(options, "kCache")?, string(options, "vCache")?);
    let d = CachePlanOptions::default();
    let plan = CachePlanOptions {
        cache_budget_mb: number(options, "cacheBudgetMb")?,
        cache_quality_prompt_len: whole(options, "cacheQualityPromptLen")?
            .unwrap_or(d.cache_quality_prompt_len),
        cache_quality_decode_steps: whole(options, "cacheQualityDecodeSteps")?
            .unwrap_or(d.cache_quality_decode_steps),
        cache_quality_max_delta_nll: number(options, "cacheQualityMaxDeltaNll")?
            .unwrap_or(d.cache_quality_max_delta_nll),
        cache_quality_max_ppl_ratio: number(options, "cacheQualityMaxPplRatio")?
            .unwrap_or(d.cache_quality_max_ppl_ratio),
        cache_quality_max_mean_kl: number(options, "cacheQualityMaxMeanKl")?
            .unwrap_or(d.cache_quality_max_mean_kl),
        cache_auto_benchmark: boolean(options, "cacheAutoBenchmark")?
            .unwrap_or(d.cache_auto_benchmark),
        cache_auto_bench_steps: whole(options, "cacheAutoBenchSteps")?
            .unwrap_or(d.cache_auto_bench_steps),
        cache_auto_bench_prompt_len: whole(options, "cacheAutoBenchPromptLen")?
            .unwrap_or(d.cache_auto_bench_prompt_len),
        cache_plan_path: None,
        cache_plan_probe: boolean(options, "cachePlanProbe")?.unwrap_or(d.cache_plan_probe),
        cache_plan_probe_interval_sec: whole(options, "cachePlanProbeIntervalSec")?
            .map(|n| n as u64)
            .unwrap_or(d.cache_plan_probe_interval_sec),
    };
    if kv
        .as_deref()
        .is_some_and(|s| s.trim().eq_ignore_ascii_case("auto"))
    {
        if k.is_some() || v.is_some() {
            return Err(Error::invalid(
                "kCache",
                "kCache and vCache cannot be combined with kvCache: 'auto' (the plan chooses one kind)",
            ));
        }
        plan.validate()?;
        return Ok((KvKinds::default(), Some(plan)));
    }
    if plan != d {
        return Err(Error::invalid(
            "kvCache",
            "the cache* settings tune kvCache: 'auto'; set kvCache: 'auto' with them",
        ));
    }
    Ok((
        KvKinds::from_options(kv.as_deref(), k.as_deref(), v.as_deref())?,
        None,
    ))
}

/// The decode plan: `decodePlan` (`'auto'`, `'fixed'`, `'none'`), `decodeQChunk`,
/// `decodeLocalWindow`, `decodeBucketShort`, `decodeBucketMid`.
pub(super) fn decode_plan(options: &JsValue) -> Result<DecodePlan> {
    let d = DecodePlan::default();
    let keys =
        |key: &'static str| -> Result<Option<u32>> { Ok(whole(options, key)?.map(|n| n as u32)) };
    let mode = match string(options, "decodePlan")? {
        Some(s) => s.parse::<DecodePlanMode>().map_err(|_| {
            Error::invalid(
                "decodePlan",
                format!("`{s}` is not 'auto', 'fixed' or 'none'"),
            )
        })?,
        None => d.mode,
    };
    let plan = DecodePlan {
        mode,
        q_chunk: keys("decodeQChunk")?,
        local_window: keys("decodeLocalWindow")?,
        bucket_short: keys("decodeBucketShort")?.unwrap_or(d.bucket_short),
        bucket_mid: keys("decodeBucketMid")?.unwrap_or(d.bucket_mid),
    };
    plan.validate().map_err(|e| {
        // name the option as JavaScript spells it
        let message = e.to_string();
        let renamed = [
            ("decode_q_chunk", "decodeQChunk"),
            ("decode_local_window", "decodeLocalWindow"),
            ("decode_bucket_short", "decodeBucketShort"),
            ("decode_bucket_mid", "decodeBucketMid"),
            ("decode_plan", "decodePlan"),
        ]
        .iter()
        .fold(message, |m, (from, to)| m.replace(from, to));
        Error::invalid("decodePlan", renamed)
    })?;
    Ok(plan)
}

/// `precision`: `'f32'` (default), `'f16'` or `'auto'`.
pub(super) fn precision(options: &JsValue) -> Result<Precision> {
    match string(options, "precision")? {
        Some(s) => s.parse(),
        None => Ok(Precision::default()),
    }
}

/// `backend` (or its older name `device`): `'auto'` (default), `'gpu'` (`'webgpu'`) or
/// `'cpu'`.
pub(super) fn device(options: &JsValue) -> Result<DeviceChoice> {
    match (string(options, "backend")?, string(options, "device")?) {
        (Some(s), _) | (None, Some(s)) => s.parse(),
        (None, None) => Ok(DeviceChoice::default()),
    }
}
