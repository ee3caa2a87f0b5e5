//! `auto` on a software adapter (lavapipe here): both backends are timed on the first load,
//! the faster runs the model and the choice is kept in the tune store; the next load reuses
//! the record without timing, a record it cannot read is timed again, and the record decides
//! (a hand-edited record is followed, one whose checksum no longer matches is not), another KV
//! cache kind is timed and kept apart. `gpu` runs on the software adapter when asked. The
//! CLI says what `auto` chose. One test: the tune store's folder is the process's
//! `EMBERLM_CACHE_DIR`.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use emberlm::backend::gpu::DeviceChoice;
use emberlm::dtype::kv::{KvKind, KvKinds};
use emberlm::engine::{BackendChoice, Chosen, Engine, EngineOptions};
use emberlm::loader::ModelFiles;
use emberlm::session::{GenerateOptions, Prompt};
use emberlm::GpuOptions;

const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/tiny-llama-q4_1.gguf"
);

fn load(device: DeviceChoice) -> Engine {
    load_with(device, KvKinds::default())
}

fn load_with(device: DeviceChoice, kv_cache: KvKinds) -> Engine {
    let files = ModelFiles::open(Path::new(MODEL)).unwrap();
    let options = EngineOptions {
        gpu: GpuOptions {
            device,
            kv_cache,
            ..GpuOptions::default()
        },
        ..EngineOptions::default()
    };
    pollster::block_on(Engine::load(files, options)).unwrap()
}

fn greedy_tokens(engine: &Engine) -> Vec<u32> {
    let options = GenerateOptions {
        sampling: emberlm::sampling::SamplingParams {
            max_new_tokens: 6,
            ..emberlm::sampling::SamplingParams::greedy()
        },
        ..GenerateOptions::default()
    };
    let prompt = Prompt::from("Permission is hereby granted");
    let g = pollster::block_on(engine.generate(&prompt, &options, &mut |_| {})).unwrap();
    g.sequences[0].tokens.clone()
}

fn on_gpu(engine: &Engine) -> bool {
    engine.inspect(|s| s.gpu().is_some()).unwrap()
}

fn choice(engine: &Engine) -> BackendChoice {
    engine
        .backend_choice()
        .cloned()
        .expect("auto on a software adapter reports its choice")
}

#[test]
fn auto_times_a_software_adapter_against_the_cpu_once_and_keeps_the_choice() {
    // it sets EMBERLM_CACHE_DIR, which the other tests of this binary read
    if common::own_process::rerun_alone(
        concat!(
            module_path!(),
            "::auto_times_a_software_adapter_against_the_cpu_once_and_keeps_the_choice"
        ),
        &[],
    ) {
        return;
    }
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let software = ctx.report().is_software();
    drop(ctx);
    let dir = std::env::temp_dir().join(format!("emberlm-backend-choice-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var("EMBERLM_CACHE_DIR", &dir);

    let first = load(DeviceChoice::Auto);
    if !software {
        // a hardware adapter runs the model without timing anything
        assert!(first.backend_choice().is_none());
        assert!(on_gpu(&first));
        return;
    }
    let c = choice(&first);
    eprintln!("{}", c.notice());
    assert!(c.measured_now);
    assert!(c.gpu_ms > 0.0 && c.cpu_ms > 0.0, "{c:?}");
    let faster = if c.cpu_ms <= c.gpu_ms {
        Chosen::Cpu
    } else {
        Chosen::Gpu
    };
    assert_eq!(c.backend, faster, "{c:?}");
    assert_eq!(on_gpu(&first), c.backend == Chosen::Gpu);
    let notice = first.backend_notice().unwrap_or_default().to_string();
    assert!(
        notice.contains("software adapter") && notice.contains("measured on this load"),
        "{notice}"
    );
    let record = PathBuf::from(c.stored_at.clone().expect("the choice was kept"));
    assert!(record.is_file(), "{record:?}");
    // the chosen backend generates what the same backend asked for by name does
    let named = load(match c.backend {
        Chosen::Cpu => DeviceChoice::Cpu,
        Chosen::Gpu => DeviceChoice::Gpu,
    });
    assert!(named.backend_choice().is_none());
    assert_eq!(greedy_tokens(&first), greedy_tokens(&named));
    drop((first, named));

    // the next load reads the record: same choice and timings, nothing timed
    let second = load(DeviceChoice::Auto);
    let c2 = choice(&second);
    assert!(!c2.measured_now);
    // the timings as read back (JSON keeps them to about 1e-15)
    assert_eq!(c2.backend, c.backend);
    assert!((c2.gpu_ms - c.gpu_ms).abs() < 1e-9 && (c2.cpu_ms - c.cpu_ms).abs() < 1e-9);
    assert!(second
        .backend_notice()
        .is_some_and(|n| n.contains("measured on an earlier load")));
    drop(second);

    // the record decides: edited to the other backend (checksum and all), the next load
    // follows it
    let text = std::fs::read_to_string(&record).unwrap();
    let mut stored: serde_json::Value = serde_json::from_str(&text).unwrap();
    let other = match c.backend {
        Chosen::Cpu => Chosen::Gpu,
        Chosen::Gpu => Chosen::Cpu,
    };
    let mut value: serde_json::Value =
        serde_json::from_str(stored["value"].as_str().expect("the value as text")).unwrap();
    value["backend"] = serde_json::to_value(other).unwrap();
    let value = value.to_string();
    stored["checksum"] = emberlm::tune::checksum(value.as_bytes()).into();
    stored["value"] = value.into();
    std::fs::write(&record, stored.to_string()).unwrap();
    let edited = load(DeviceChoice::Auto);
    assert_eq!(choice(&edited).backend, other);
    assert!(!choice(&edited).measured_now);
    assert_eq!(on_gpu(&edited), other == Chosen::Gpu);
    drop(edited);

    // a record that cannot be read is timed again and rewritten
    std::fs::write(&record, "{ not json").unwrap();
    let again = load(DeviceChoice::Auto);
    assert!(choice(&again).measured_now);
    let rewritten: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    let value: serde_json::Value =
        serde_json::from_str(rewritten["value"].as_str().expect("the value as text")).unwrap();
    assert_eq!(
        value["backend"],
        serde_json::to_value(choice(&again).backend).unwrap()
    );
    drop(again);

    // an edit that leaves the checksum behind is not trusted: timed again
    let text = std::fs::read_to_string(&record).unwrap();
    let flipped = match choice_backend_text(&text) {
        "cpu" => text.replacen("\\\"cpu\\\"", "\\\"gpu\\\"", 1),
        _ => text.replacen("\\\"gpu\\\"", "\\\"cpu\\\"", 1),
    };
    assert_ne!(flipped, text);
    std::fs::write(&record, flipped).unwrap();
    let again = load(DeviceChoice::Auto);
    assert!(choice(&again).measured_now);
    drop(again);

    // another KV cache kind is timed with that kind, kept in a record of its own, and the
    // chosen backend runs with it
    let q8 = KvKinds::both(KvKind::Q8_0);
    let quantized = load_with(DeviceChoice::Auto, q8);
    let cq = choice(&quantized);
    assert!(
        cq.measured_now,
        "the f32 record was reused for q8_0: {cq:?}"
    );
    assert_ne!(cq.stored_at, c.stored_at);
    assert_eq!(quantized.inspect(|s| s.forward().kv_kinds()).unwrap(), q8);
    drop(quantized);
    let quantized = load_with(DeviceChoice::Auto, q8);
    assert!(!choice(&quantized).measured_now);
    assert_eq!(quantized.inspect(|s| s.forward().kv_kinds()).unwrap(), q8);
    drop(quantized);

    // `gpu` runs on the software adapter when asked, without timing
    let gpu = load(DeviceChoice::Gpu);
    assert!(on_gpu(&gpu) && gpu.backend_choice().is_none());
    drop(gpu);

    // the CLI says what auto chose and why (a fresh store: it times and keeps)
    let cli_dir = dir.join("cli");
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_emberlm"))
            .args([
                "generate",
                "--model",
                MODEL,
                "--prompt",
                "x",
                "--max-new-tokens",
                "2",
            ])
            .env("EMBERLM_CACHE_DIR", &cli_dir)
            .env_remove("EMBERLM_DEVICE")
            .output()
            .expect("the binary runs")
    };
    let out = run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("software adapter") && err.contains("measured on this load"),
        "{err}"
    );
    let out = run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("measured on an earlier load"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The backend a stored record names (`cpu` or `gpu`), from its value text.
fn choice_backend_text(record: &str) -> &'static str {
    let stored: serde_json::Value = serde_json::from_str(record).unwrap();
    let value: serde_json::Value =
        serde_json::from_str(stored["value"].as_str().expect("the value as text")).unwrap();
    match value["backend"].as_str() {
        Some("cpu") => "cpu",
        _ => "gpu",
    }
}
