use serde_json::json;

use super::*;
use crate::dtype::kv::KvKind;

fn page(v: Value) -> Result<EngineOptions> {
    LoadOptions::from_json(&v, Surface::Page)?.resolve()
}

fn message(r: Result<impl std::fmt::Debug>) -> String {
    match r {
        Ok(v) => panic!("accepted: {v:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn every_spelling_of_a_key_is_one_key() {
    for v in [
        json!({ "kvCache": "q8_0" }),
        json!({ "kv_cache": "q8" }),
        json!({ "cache_kind": "q8" }),
        json!({ "KV-CACHE": "Q8_0" }),
    ] {
        let o = page(v.clone()).unwrap();
        assert_eq!(o.gpu.kv_cache, KvKinds::both(KvKind::Q8_0), "{v}");
    }
    for (name, kind) in [
        ("fp32", KvKind::F32),
        ("fp16", KvKind::F16),
        ("q8", KvKind::Q8_0),
        ("q4", KvKind::Q4_0),
        ("nf4", KvKind::Nf4),
    ] {
        let o = page(json!({ "cache_kind": name })).unwrap();
        assert_eq!(o.gpu.kv_cache, KvKinds::both(kind), "{name}");
    }
    assert_eq!(
        page(json!({ "contextLength": "auto" })).unwrap().context,
        None
    );
    let m = message(page(json!({ "contextLength": "long" })));
    assert!(
        m.contains("contextLength") && m.contains("whole number"),
        "{m}"
    );
    let o = page(json!({ "max_seq_len": 8192, "device": "cpu" })).unwrap();
    assert_eq!(o.context, Some(8192));
    assert_eq!(o.gpu.device, DeviceChoice::Cpu);
}

#[test]
fn an_unknown_key_is_refused_naming_the_nearest() {
    let m = message(page(json!({ "kvCahce": "q8_0" })));
    assert!(m.contains("`kvCahce`") && m.contains("`kvCache`"), "{m}");
    let m = message(page(json!({ "cache_budgte_mb": 10 })));
    assert!(m.contains("`cacheBudgetMb`"), "{m}");
    // nothing near: no guess
    let m = message(page(json!({ "zzzzzzzzzz": 1 })));
    assert!(
        m.contains("unknown load option `zzzzzzzzzz`") && !m.contains("mean"),
        "{m}"
    );
    // the command line names flags
    let mut cli = LoadOptions::new(Surface::Cli);
    let m = message(cli.set("--kv-cahce", OptionValue::Text("q8_0".into())));
    assert!(m.contains("`--kv-cache`"), "{m}");
}

#[test]
fn a_key_given_twice_or_of_the_wrong_type_is_refused() {
    let m = message(page(json!({ "kvCache": "f16", "kv_cache": "q8_0" })));
    assert!(m.contains("twice"), "{m}");
    let m = message(page(json!({ "contextLength": 1.5 })));
    assert!(m.contains("contextLength") && m.contains("whole"), "{m}");
    let m = message(page(
        json!({ "cacheAutoBenchmark": "yes", "kvCache": "auto" }),
    ));
    assert!(
        m.contains("cacheAutoBenchmark") && m.contains("true or false"),
        "{m}"
    );
    let m = message(page(json!({ "contextLength": 0 })));
    assert!(m.contains("at least 1"), "{m}");
    let m = message(LoadOptions::from_json(&json!([1]), Surface::Page));
    assert!(m.contains("must be an object"), "{m}");
    // null is "not given", as JavaScript's undefined
    assert_eq!(
        page(json!({ "kvCache": null })).unwrap().gpu.kv_cache,
        KvKinds::default()
    );
}

#[test]
fn keys_of_another_surface_say_why() {
    let m = message(LoadOptions::from_json(
        &json!({ "cachePlanPath": "/tmp" }),
        Surface::Page,
    ));
    assert!(m.contains("Cache API"), "{m}");
    let m = message(LoadOptions::from_json(
        &json!({ "cache": "models" }),
        Surface::File,
    ));
    assert!(m.contains("page"), "{m}");
    let m = message(LoadOptions::from_json(
        &json!({ "onProgress": 1 }),
        Surface::Page,
    ));
    assert!(m.contains("JavaScript"), "{m}");
    assert_eq!(LoadOptions::js_key("on_progress"), Some("onProgress"));
    assert_eq!(LoadOptions::js_key("kvCache"), None);
}

/// The requirements' own examples: as written, or refused with the reason.
#[test]
fn the_requirements_examples_work_as_written() {
    let o = page(json!({
        "max_seq_len": 8192, "cache_kind": "q8", "decode_plan": "auto", "cache_budget_mb": 2048
    }))
    .unwrap();
    assert_eq!(o.context, Some(8192));
    assert_eq!(o.gpu.kv_cache, KvKinds::both(KvKind::Q8_0));
    assert_eq!(o.kv_budget_mb, Some(2048.0));
    assert!(o.cache_plan.is_none());
    let o = page(json!({
        "decode_plan": "fixed", "decode_q_chunk": 128, "decode_local_window": 512
    }))
    .unwrap();
    assert_eq!(o.gpu.decode_plan.mode, DecodePlanMode::Fixed);
    assert_eq!(o.gpu.decode_plan.q_chunk, Some(128));
    assert_eq!(o.gpu.decode_plan.local_window, Some(512));
}

#[test]
fn combinations_are_checked_once_naming_the_keys_as_written() {
    // a setting of the automatic plan without `auto`
    let m = message(page(json!({ "cacheQualityPromptLen": 32 })));
    assert!(
        m.contains("cacheQualityPromptLen") && m.contains("kvCache auto"),
        "{m}"
    );
    let m = message(page(json!({ "kvCache": "auto", "k_cache": "f16" })));
    assert!(
        m.contains("k_cache") && m.contains("cannot be combined"),
        "{m}"
    );
    let m = message(page(json!({ "kvCache": "auto", "cacheBudgetMb": -1 })));
    assert!(m.contains("cacheBudgetMb"), "{m}");
    let m = message(page(json!({ "kvCache": "auto", "cacheAutoBenchSteps": 0 })));
    assert!(m.contains("cacheAutoBenchSteps"), "{m}");
    let m = message(page(json!({ "kvCache": "int3" })));
    assert!(m.contains("kvCache") && m.contains("int3"), "{m}");
    // the decode plan, named as each surface writes it
    let m = message(page(json!({ "decodePlan": "fixed" })));
    assert!(m.contains("decodeQChunk"), "{m}");
    let m = message(page(json!({ "decode_plan": "fixed" })));
    assert!(
        m.contains("decode_plan") && m.contains("decodeQChunk"),
        "{m}"
    );
    let mut cli = LoadOptions::new(Surface::Cli);
    cli.set("--decode-plan", OptionValue::Text("fixed".into()))
        .unwrap();
    let m = message(cli.resolve());
    assert!(
        m.contains("--decode-q-chunk") && m.contains("--decode-plan"),
        "{m}"
    );
    let m = message(page(json!({ "decodeBucketShort": 4096 })));
    assert!(m.contains("decodeBucketShort"), "{m}");
    let m = message(page(json!({ "precision": "f8" })));
    assert!(m.contains("precision") && m.contains("f8"), "{m}");
    let m = message(page(json!({ "backend": "tpu" })));
    assert!(m.contains("backend") && m.contains("tpu"), "{m}");
    let m = message(page(json!({ "kernels": "nonsense=1" })));
    assert!(m.contains("kernels"), "{m}");
    // a good automatic plan
    let o =
        page(json!({ "kvCache": "auto", "cacheBudgetMb": 64, "cachePlanProbe": false })).unwrap();
    let plan = o.cache_plan.unwrap();
    assert_eq!(plan.cache_budget_mb, Some(64.0));
    assert!(!plan.cache_plan_probe);
    assert_eq!(o.kv_budget_mb, None);
}

#[test]
fn flags_override_a_settings_file() {
    let file = LoadOptions::from_file_text(
        r#"{ "cache_kind": "q8", "contextLength": 512, "decodePlan": "none" }"#,
        "emberlm.json",
    )
    .unwrap();
    let mut cli = LoadOptions::new(Surface::Cli);
    cli.set("--kv-cache", OptionValue::Text("f16".into()))
        .unwrap();
    let o = cli.over(file).resolve().unwrap();
    assert_eq!(o.gpu.kv_cache, KvKinds::both(KvKind::F16));
    assert_eq!(o.context, Some(512));
    assert_eq!(o.gpu.decode_plan.mode, DecodePlanMode::None);
    let m = message(LoadOptions::from_file_text("{ \"kvCahce\": 1 }", "a.json"));
    assert!(m.contains("a.json") && m.contains("kvCache"), "{m}");
    let m = message(LoadOptions::from_file_text("kv_cache: q8", "a.json"));
    assert!(m.contains("a.json") && m.contains("JSON"), "{m}");
}

/// The TypeScript interface in the package's types is the one the table makes.
#[test]
fn the_typescript_interface_is_the_tables() {
    let ts = load_keys::typescript();
    assert!(
        include_str!("../web/typescript_options.rs").contains(&ts),
        "src/web/typescript_options.rs's LoadOptions differs from the table; it should read:\n{ts}"
    );
    for k in load_keys::KEYS {
        if !matches!(k.scope, Scope::Native(_)) {
            assert!(ts.contains(&format!("  {}?: ", k.name)), "{}", k.name);
        }
    }
}

#[test]
fn every_key_has_one_normalized_form() {
    let mut seen = std::collections::BTreeSet::new();
    for k in load_keys::KEYS {
        for form in std::iter::once(k.name).chain(k.aliases.iter().copied()) {
            assert!(seen.insert(load_keys::normalized(form)), "{form} twice");
        }
    }
}

/// Prints the generated interface (`cargo test --lib print_load_options_typescript -- --ignored
/// --nocapture`), to paste into `src/web/typescript_options.rs` after changing the table.
#[test]
#[ignore]
fn print_load_options_typescript() {
    print!("{}", load_keys::typescript());
}

#[test]
fn f32_by_name_is_exact_on_the_cpu_and_nothing_else_is() {
    use crate::backend::cpu::CpuPrecision;
    for (v, want) in [
        (json!({}), CpuPrecision::Int8),
        (json!({ "precision": "auto" }), CpuPrecision::Int8),
        (json!({ "precision": "f16" }), CpuPrecision::Int8),
        (json!({ "precision": "f32" }), CpuPrecision::F32),
        (
            json!({ "precision": "F32", "backend": "cpu" }),
            CpuPrecision::F32,
        ),
    ] {
        assert_eq!(page(v.clone()).unwrap().cpu_precision, want, "{v}");
    }
}
