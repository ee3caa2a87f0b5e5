//! The candidate selection kernel against its CPU reference on fresh random rows: awkward row
//! lengths, ties, negative values, adjustments at both ends of the row, constraint masks
//! (dense, and sparser than k), k of 1, 40 and 256.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use common::select_ref;
use emberlm::backend::gpu::{GpuContext, KernelCache, Select};
use emberlm::sampling::candidates::{
    Candidates, LogitAdjustment, OpenAiPenalty, SelectRequest, MAX_ADJUSTMENTS, MAX_RESULT_BYTES,
};
use emberlm::GpuOptions;
use rand::Rng;

/// Runs the kernel once on `row` (uploaded as a fresh buffer) and parses its result.
fn run(ctx: &GpuContext, cache: &KernelCache, row: &[f32], request: &SelectRequest) -> Candidates {
    let logits = ctx.storage_from("logits", row).unwrap();
    let select = pollster::block_on(Select::new(ctx, cache, &logits, row.len() as u32)).unwrap();
    select.write(ctx, request).unwrap();
    ctx.submit_pass("select", |pass| select.record(pass));
    let bytes =
        pollster::block_on(ctx.read_bytes(select.result(), request.result_bytes())).unwrap();
    assert!(request.result_bytes() as usize <= MAX_RESULT_BYTES);
    Select::parse(&bytes, request).unwrap()
}

fn random_adjustments(rng: &mut impl Rng, n: usize) -> Vec<LogitAdjustment> {
    let count = rng.random_range(0..=MAX_ADJUSTMENTS.min(n));
    let mut ids: Vec<u32> = Vec::new();
    if count > 0 {
        ids.push(0);
        ids.push(n as u32 - 1);
    }
    while ids.len() < count + 2 && ids.len() < n {
        ids.push(rng.random_range(0..n as u32));
    }
    ids.sort_unstable();
    ids.dedup();
    ids.truncate(count.max(usize::from(count > 0)));
    ids.into_iter()
        .map(|id| LogitAdjustment {
            id,
            bias: rng
                .random_bool(0.5)
                .then(|| rng.random_range(-100.0f32..100.0)),
            repetition: rng.random_bool(0.5).then(|| rng.random_range(0.5f32..2.0)),
            penalty: rng.random_bool(0.5).then(|| OpenAiPenalty {
                presence: rng.random_range(-2.0f32..2.0),
                frequency: rng.random_range(-2.0f32..2.0),
                count: rng.random_range(1..20),
            }),
        })
        .collect()
}

fn close(a: f32, b: f32, rel: f32) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-30)
}

#[test]
fn selection_matches_the_cpu_reference() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    let mut rng = common::rng("selection_matches_the_cpu_reference", &|m| eprintln!("{m}"));
    let mut cases = 0;
    for n in [1usize, 7, 39, 40, 41, 255, 256, 257, 1000, 50_001] {
        for k in [1u32, 40, 256] {
            let k = k.min(n as u32);
            let row = select_ref::random_row(&mut rng, n);
            let request = SelectRequest {
                n: n as u32,
                k,
                temperature: [1.0f32, 0.7, 1.5][rng.random_range(0..3)],
                adjustments: random_adjustments(&mut rng, n),
                mask: select_ref::random_mask(&mut rng, n).map(std::sync::Arc::new),
            };
            let got = run(&ctx, &cache, &row, &request);
            let want = select_ref::select(&row, &request);
            let what = format!(
                "n {n} k {k} adjustments {} masked {}",
                request.adjustments.len(),
                request.mask.is_some()
            );
            assert!(!got.non_finite, "{what}");
            assert_eq!(got.n, want.n, "{what}");
            assert_eq!(got.ids, want.ids, "{what}: ids");
            let bits = |v: &[f32]| v.iter().map(|x| (x + 0.0).to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got.adjusted),
                bits(&want.adjusted),
                "{what}: adjusted"
            );
            assert_eq!(bits(&got.raw), bits(&want.raw), "{what}: raw");
            assert_eq!(bits(&got.adjusted_raw), bits(&want.adjusted_raw), "{what}");
            assert_eq!(got.raw_max, want.raw_max, "{what}: raw max");
            assert_eq!(got.adjusted_max, want.adjusted_max, "{what}: adjusted max");
            assert!(
                close(got.raw_sum, want.raw_sum, 1e-4),
                "{what}: {got:?} {want:?}"
            );
            for (g, w, name) in [
                (got.tail_sum, want.tail_sum, "tail"),
                (
                    got.adjusted_tail_sum,
                    want.adjusted_tail_sum,
                    "adjusted tail",
                ),
            ] {
                assert!(
                    close(g, w, 1e-3) || (g - w).abs() < 1e-6 * got.raw_sum.max(1.0),
                    "{what}: {name} {g} vs {w}"
                );
            }
            cases += 1;
        }
    }
    eprintln!("{cases} rows checked");
}

#[test]
fn all_equal_rows_keep_the_lowest_ids() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    for n in [300usize, 70_000] {
        let row = vec![-1.25f32; n];
        for k in [1u32, 40, 256] {
            let request = SelectRequest {
                n: n as u32,
                k,
                temperature: 1.0,
                adjustments: Vec::new(),
                mask: None,
            };
            let got = run(&ctx, &cache, &row, &request);
            assert_eq!(got.ids, (0..k).collect::<Vec<_>>(), "n {n} k {k}");
        }
    }
}

#[test]
fn non_finite_logits_are_flagged() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut row: Vec<f32> = (0..1000).map(|i| (i % 17) as f32).collect();
        row[777] = bad;
        let request = SelectRequest {
            n: 1000,
            k: 40,
            temperature: 1.0,
            adjustments: Vec::new(),
            mask: None,
        };
        assert!(run(&ctx, &cache, &row, &request).non_finite, "{bad}");
        row[777] = 1.0;
        assert!(!run(&ctx, &cache, &row, &request).non_finite);
    }
}

#[test]
fn requests_the_kernel_cannot_serve_are_rejected() {
    let Some(ctx) = common::native_gpu(GpuOptions::default()) else {
        return;
    };
    let cache = KernelCache::new();
    let logits = ctx.storage_from("logits", &[0.0f32; 100]).unwrap();
    let select = pollster::block_on(Select::new(&ctx, &cache, &logits, 100)).unwrap();
    let ok = SelectRequest {
        n: 100,
        k: 10,
        temperature: 1.0,
        adjustments: Vec::new(),
        mask: None,
    };
    assert!(select.write(&ctx, &ok).is_ok());
    let adj = |id| LogitAdjustment {
        id,
        bias: Some(1.0),
        repetition: None,
        penalty: None,
    };
    for (bad, name) in [
        (
            SelectRequest {
                n: 101,
                ..ok.clone()
            },
            "n",
        ),
        (SelectRequest { k: 0, ..ok.clone() }, "k"),
        (
            SelectRequest {
                k: 101,
                ..ok.clone()
            },
            "k",
        ),
        (
            SelectRequest {
                temperature: 0.0,
                ..ok.clone()
            },
            "temperature",
        ),
        (
            SelectRequest {
                adjustments: vec![adj(5), adj(5)],
                ..ok.clone()
            },
            "adjustments",
        ),
        (
            SelectRequest {
                adjustments: vec![adj(100)],
                ..ok.clone()
            },
            "adjustments",
        ),
        (
            SelectRequest {
                mask: Some(std::sync::Arc::new(vec![1; 3])),
                ..ok.clone()
            },
            "mask",
        ),
        (
            SelectRequest {
                mask: Some(std::sync::Arc::new(vec![0; 4])),
                ..ok.clone()
            },
            "mask",
        ),
    ] {
        let err = select.write(&ctx, &bad).unwrap_err();
        assert!(err.to_string().contains(name), "{err}");
    }
}
