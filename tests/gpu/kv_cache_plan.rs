//! `kv_cache: "auto"` (the automatic cache plan) on lavapipe: the budget drops the right
//! kinds, the quality gates are applied, the decision is stored and reused, and a stale or
//! corrupt record is measured again; on SmolLM2, f16 and q8_0 pass the default gates.
//!
//! Without an adapter these tests print why and pass, unless `EMBERLM_REQUIRE_GPU=1` is set
//! (as `./build.sh test` does), in which case they fail.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::{Path, PathBuf};

use emberlm::dtype::kv::KvKind;
use emberlm::loader::ModelFiles;
use emberlm::session::{CacheDecision, CachePlanOptions, Session};
use emberlm::GpuOptions;

fn tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama-f32.gguf")
}

fn plan_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("emberlm-cache-plan-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Loads `model` with a KV cache of `context` positions and runs the plan.
fn plan(
    model: &Path,
    context: usize,
    options: &CachePlanOptions,
) -> Option<(Session, emberlm::Result<CacheDecision>)> {
    let ctx = common::native_gpu(GpuOptions::default())?;
    let files = ModelFiles::open(model).unwrap();
    let mut session = pollster::block_on(Session::new(ctx, &files, Some(context))).unwrap();
    let decision = pollster::block_on(session.plan_kv_cache(options));
    Some((session, decision))
}

fn candidate<'d>(d: &'d CacheDecision, kind: &str) -> &'d emberlm::session::CacheCandidate {
    d.candidates.iter().find(|c| c.kind == kind).unwrap()
}

#[test]
fn budget_drops_kinds_and_the_decision_is_kept_and_reused() {
    let dir = plan_dir("budget");
    // tiny-llama: 2 layers, kv_dim 32 (one block per row); at 128 positions f32 needs
    // 64 KiB, f16 32 KiB, q8_0 18 KiB, the 4-bit kinds 10 KiB
    let options = CachePlanOptions {
        cache_budget_mb: Some(20.0 / 1024.0),
        cache_plan_path: Some(dir.display().to_string()),
        // the random fixture is far more sensitive than a trained model: loose gates here,
        // the gates' own test is below
        cache_quality_max_delta_nll: 10.0,
        cache_quality_max_ppl_ratio: 1e4,
        cache_quality_max_mean_kl: 10.0,
        ..CachePlanOptions::default()
    };
    let Some((session, decision)) = plan(&tiny(), 128, &options) else {
        return;
    };
    let d = decision.unwrap();
    eprintln!("{d:#?}");
    assert_eq!(d.source, "measured");
    for kind in ["f32", "f16"] {
        let reason = candidate(&d, kind).dropped.as_deref().unwrap_or("");
        assert!(reason.contains("budget"), "{kind}: {reason}");
        assert!(
            candidate(&d, kind).delta_nll.is_none(),
            "{kind} was measured"
        );
    }
    for kind in ["q8_0", "q4_0", "nf4"] {
        let c = candidate(&d, kind);
        assert!(c.dropped.is_none(), "{kind}: {:?}", c.dropped);
        assert!(c.delta_nll.is_some() && c.mean_kl.is_some() && c.decode_tok_s.is_some());
    }
    assert!(["q8_0", "q4_0", "nf4"].contains(&d.kind.as_str()));
    // the session runs with the decision
    assert_eq!(session.forward().kv_kinds().k.name(), d.kind);
    assert_eq!(session.context(), 128);
    let stored = d.stored_at.clone().unwrap();
    assert!(Path::new(&stored).is_file(), "{stored}");

    // a second load reuses it without measuring
    let (_, again) = plan(&tiny(), 128, &options).unwrap();
    let again = again.unwrap();
    assert_eq!(again.source, "reused");
    assert_eq!(again.kind, d.kind);
    assert_eq!(again.measured_at, d.measured_at);

    // a corrupt record is ignored and measured again (and replaced)
    std::fs::write(&stored, "{ not json").unwrap();
    let (_, rebuilt) = plan(&tiny(), 128, &options).unwrap();
    assert_eq!(rebuilt.unwrap().source, "measured");
    let text = std::fs::read_to_string(&stored).unwrap();
    let record: serde_json::Value = serde_json::from_str(&text).unwrap();
    let value = record["value"].as_str().unwrap_or("");
    assert!(value.contains("\"kind\""), "{text}");

    // a stale one too (probe interval 0)
    let stale = CachePlanOptions {
        cache_plan_probe_interval_sec: 0,
        ..options.clone()
    };
    let (_, probed) = plan(&tiny(), 128, &stale).unwrap();
    assert_eq!(probed.unwrap().source, "measured");
    // without probing, the record stands whatever its age
    let keep = CachePlanOptions {
        cache_plan_probe: false,
        ..stale
    };
    let (_, kept) = plan(&tiny(), 128, &keep).unwrap();
    assert_eq!(kept.unwrap().source, "reused");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn gates_drop_kinds_and_nothing_passing_falls_back_or_fails() {
    let dir = plan_dir("gates");
    // gates no quantized cache can meet: only f32 (ΔNLL 0) passes
    let strict = CachePlanOptions {
        cache_plan_path: Some(dir.display().to_string()),
        cache_quality_max_delta_nll: 0.0,
        cache_quality_max_ppl_ratio: 1.0,
        cache_quality_max_mean_kl: 0.0,
        cache_auto_benchmark: false,
        ..CachePlanOptions::default()
    };
    let Some((session, decision)) = plan(&tiny(), 100, &strict) else {
        return;
    };
    let d = decision.unwrap();
    assert_eq!(d.kind, "f32");
    assert_eq!(session.forward().kv_kinds().k, KvKind::F32);
    assert_eq!(candidate(&d, "f32").delta_nll, Some(0.0));
    for kind in ["q8_0", "q4_0", "nf4"] {
        let reason = candidate(&d, kind).dropped.as_deref().unwrap_or("");
        assert!(reason.contains("cache_quality_max_"), "{kind}: {reason}");
    }
    // without the benchmark, the smallest survivor is kept: with loose gates, a 4-bit kind
    let loose = CachePlanOptions {
        cache_plan_path: Some(plan_dir("gates-loose").display().to_string()),
        cache_quality_max_delta_nll: 10.0,
        cache_quality_max_ppl_ratio: 1e4,
        cache_quality_max_mean_kl: 10.0,
        cache_auto_benchmark: false,
        ..CachePlanOptions::default()
    };
    let (_, d) = plan(&tiny(), 100, &loose).unwrap();
    let d = d.unwrap();
    assert!(["q4_0", "nf4"].contains(&d.kind.as_str()), "{}", d.kind);
    assert!(d.candidates.iter().all(|c| c.decode_tok_s.is_none()));

    // a budget f32 does not fit and strict gates: an error naming the budget
    let impossible = CachePlanOptions {
        cache_budget_mb: Some(0.04),
        cache_plan_path: Some(plan_dir("gates-none").display().to_string()),
        ..strict
    };
    let (session, e) = plan(&tiny(), 100, &impossible).unwrap();
    let e = e.unwrap_err().to_string();
    assert!(
        e.contains("cache_budget_mb") && e.contains("0.040 MiB"),
        "{e}"
    );
    // and the session is left as it was loaded
    assert_eq!(session.context(), 100);
    assert_eq!(session.forward().kv_kinds().k, KvKind::F32);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn smollm2_f16_and_q8_0_pass_the_default_gates() {
    let Some(model) = common::require::smollm2() else {
        return;
    };
    let options = CachePlanOptions {
        cache_plan_path: Some(plan_dir("smollm2").display().to_string()),
        cache_auto_benchmark: false,
        ..CachePlanOptions::default()
    };
    let Some((_, d)) = plan(&model, 512, &options) else {
        return;
    };
    let d = d.unwrap();
    for c in &d.candidates {
        eprintln!(
            "SmolLM2 {}: ΔNLL {:?} PPL ratio {:?} KL {:?} {:?}",
            c.kind, c.delta_nll, c.ppl_ratio, c.mean_kl, c.dropped
        );
    }
    for kind in ["f16", "q8_0"] {
        let c = candidate(&d, kind);
        assert!(
            c.dropped.is_none(),
            "{kind} failed the default gates: {:?}",
            c.dropped
        );
    }
    // f16 is nearly exact
    assert!(candidate(&d, "f16").delta_nll.unwrap().abs() < 5e-3);
}
