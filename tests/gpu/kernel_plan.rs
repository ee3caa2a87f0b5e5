//! The kernel plan end to end on the native adapter: measured at the first load and stored,
//! reused at the next, rebuilt when the stored plan is corrupt, overridden per family, and a
//! bad `EMBERLM_KERNELS` refused with its name. One test, because it points the plan store at
//! a private folder through the environment.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::PathBuf;

use emberlm::backend::gpu::plan::{Family, Source};
use emberlm::backend::gpu::{plan_key, Forward};
use emberlm::backend::gpu::{KernelCache, KernelOverrides, KernelPlan, Variant};
use emberlm::loader::ModelFiles;
use emberlm::tune::Store;
use emberlm::{GpuContext, GpuOptions};

fn load(ctx: &GpuContext, model: &str) -> emberlm::Result<(KernelPlan, Vec<u32>)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(model);
    let files = ModelFiles::open(&path)?;
    let weights = files.weights()?;
    let cache = KernelCache::new();
    let mut fwd = pollster::block_on(Forward::new(ctx, &cache, &weights, 64, 16))?;
    // a few greedy tokens, to compare plans by what they compute
    let mut tokens = vec![1u32, 5, 9];
    let mut logits = pollster::block_on(fwd.forward(ctx, &tokens, false))?;
    for _ in 0..8 {
        let next = common::forward_cases::argmax(&logits);
        tokens.push(next);
        logits = pollster::block_on(fwd.forward(ctx, &[next], false))?;
    }
    Ok((fwd.plan().clone(), tokens))
}

fn sources(plan: &KernelPlan) -> Vec<Source> {
    Family::ALL.iter().map(|f| plan.choices[f].1).collect()
}

#[test]
fn plans_are_measured_stored_reused_and_rebuilt() {
    // it sets EMBERLM_CACHE_DIR and EMBERLM_KERNELS, which the other tests of this binary read
    if common::own_process::rerun_alone(
        concat!(
            module_path!(),
            "::plans_are_measured_stored_reused_and_rebuilt"
        ),
        &[],
    ) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("emberlm-plan-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // SAFETY: the only test of this process (above); set before any thread reads the environment.
    unsafe {
        std::env::set_var("EMBERLM_CACHE_DIR", &dir);
        std::env::remove_var("EMBERLM_KERNELS");
    }
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let model = "tiny-llama-q4_1.gguf";

    let (first, tokens) = load(&ctx, model).unwrap();
    assert_eq!(sources(&first), vec![Source::Measured; 3], "{first:?}");
    for f in Family::ALL {
        let timed: Vec<Variant> = first
            .timings
            .iter()
            .filter(|t| t.family == f)
            .map(|t| t.variant)
            .collect();
        let declared: Vec<Variant> = f.variants().iter().map(|s| s.variant).collect();
        assert_eq!(
            timed.len(),
            declared.len(),
            "{f}: every variant timed: {first:?}"
        );
        assert!(
            declared.iter().all(|v| timed.contains(v)),
            "{f}: {timed:?} vs the table's {declared:?}"
        );
        assert!(first
            .timings
            .iter()
            .all(|t| t.seconds > 0.0 && t.seconds.is_finite()));
    }
    let stored = PathBuf::from(first.stored_at.clone().expect("plan stored"));
    assert!(stored.starts_with(&dir) && stored.is_file(), "{stored:?}");

    // the next load reuses it without timing anything
    let (again, tokens_again) = load(&ctx, model).unwrap();
    assert_eq!(sources(&again), vec![Source::Reused; 3]);
    assert_eq!(again.measure_seconds, 0.0);
    for f in Family::ALL {
        assert_eq!(again.variant(f), first.variant(f));
    }
    assert_eq!(tokens_again, tokens);

    // a corrupt plan is ignored, measured again and rewritten
    std::fs::write(&stored, "{\"key\": {\"what\": 3}, \"value\"").unwrap();
    let (rebuilt, _) = load(&ctx, model).unwrap();
    assert_eq!(sources(&rebuilt), vec![Source::Measured; 3]);
    let text = std::fs::read_to_string(&stored).unwrap();
    assert!(
        serde_json::from_str::<serde_json::Value>(&text).is_ok(),
        "{text}"
    );

    // a plan stored for another model shape is not this one's
    let files = ModelFiles::open(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-gpt2-f32.gguf"),
    )
    .unwrap();
    let other = plan_key(&ctx, &files.weights().unwrap(), 16);
    assert_ne!(
        Store::platform().location(&other),
        Some(stored.display().to_string())
    );

    // forcing one family keeps the stored choice for the others; both shapes compute the
    // same greedy tokens
    for variant in Variant::EVERY_FAMILY {
        let options = GpuOptions {
            kernels: KernelOverrides::none().with(Family::Attention, variant),
            ..GpuOptions::default()
        };
        let forced_ctx = common::native_gpu(options).unwrap();
        let (plan, forced_tokens) = load(&forced_ctx, model).unwrap();
        assert_eq!(plan.choices[&Family::Attention], (variant, Source::Forced));
        assert_eq!(plan.choices[&Family::LinearDecode].1, Source::Reused);
        assert_eq!(forced_tokens, tokens, "attention forced to {variant}");
    }
    for variant in Variant::EVERY_FAMILY {
        let forced_ctx = common::native_gpu(GpuOptions {
            kernels: KernelOverrides::all(variant),
            ..GpuOptions::default()
        })
        .unwrap();
        let (plan, forced_tokens) = load(&forced_ctx, model).unwrap();
        assert_eq!(sources(&plan), vec![Source::Forced; 3]);
        assert_eq!(forced_tokens, tokens, "every family forced to {variant}");
    }

    // a bad EMBERLM_KERNELS is an error that names it, at load
    unsafe { std::env::set_var("EMBERLM_KERNELS", "linear_decode=fast") };
    let err = load(&ctx, model).unwrap_err().to_string();
    assert!(
        err.contains("EMBERLM_KERNELS") && err.contains("unknown kernel variant `fast`"),
        "{err}"
    );
    unsafe { std::env::remove_var("EMBERLM_KERNELS") };
    let _ = std::fs::remove_dir_all(&dir);
}
