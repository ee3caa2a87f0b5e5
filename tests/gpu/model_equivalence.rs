//! Every fixture loads from GGUF and from its Hugging Face twin to the same configuration and,
//! after dequantization, the same logical tensors; quantized GGUF files stay within their
//! format's error of the f32 originals.

#![cfg(not(target_arch = "wasm32"))]

use std::path::PathBuf;

use emberlm::config::{ModelConfig, RopeLayout};
use emberlm::dtype::{dequantize, DType};
use emberlm::format::gguf_model::GgufModel;
use emberlm::format::safetensors::HfFolder;
use emberlm::model::weights::{ModelWeights, Tensor};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn gguf(name: &str) -> GgufModel {
    GgufModel::read(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn values(name: &str, t: &Tensor<'_>) -> Vec<f32> {
    dequantize(t.dtype, &t.data, t.n_elements() as u64, name).unwrap()
}

/// Fields that depend on the file format, not on the model, set equal for comparison.
fn format_neutral(mut c: ModelConfig) -> ModelConfig {
    c.rope_layout = match c.rope_layout {
        RopeLayout::None => RopeLayout::None,
        _ => RopeLayout::RotateHalf,
    };
    c
}

/// GGUF llama files store Q/K rows permuted so that interleaved-pair RoPE can be used: row
/// `h·hd + 2i + j` of the GGUF matrix is row `h·hd + j·hd/2 + i` of the Hugging Face one.
fn unpermute_rows(v: &[f32], heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; v.len()];
    for h in 0..heads {
        for i in 0..head_dim / 2 {
            for j in 0..2 {
                let gguf_row = h * head_dim + 2 * i + j;
                let hf_row = h * head_dim + j * head_dim / 2 + i;
                out[hf_row * cols..(hf_row + 1) * cols]
                    .copy_from_slice(&v[gguf_row * cols..(gguf_row + 1) * cols]);
            }
        }
    }
    out
}

fn assert_same_model(gguf_name: &str, hf_name: &str) {
    let g = gguf(gguf_name);
    let gw = g.weights().unwrap();
    let hf = HfFolder::read(&fixture(hf_name)).unwrap();
    let hw = hf.load().unwrap();
    assert_eq!(
        format_neutral(gw.config.clone()),
        format_neutral(hw.config.clone()),
        "{gguf_name} vs {hf_name}"
    );
    compare_tensors(&gw, &hw, gguf_name);
}

fn compare_tensors(gw: &ModelWeights<'_>, hw: &ModelWeights<'_>, what: &str) {
    let c = &gw.config;
    let mut names: Vec<&String> = gw.tensors.keys().collect();
    names.sort();
    assert_eq!(
        names,
        {
            let mut h: Vec<&String> = hw.tensors.keys().collect();
            h.sort();
            h
        },
        "{what}: tensor names"
    );
    for name in names {
        let (gt, ht) = (&gw.tensors[name], &hw.tensors[name]);
        assert_eq!(gt.shape, ht.shape, "{what}: {name}");
        let mut gv = values(name, gt);
        if c.rope_layout == RopeLayout::Interleaved {
            let cols = gt.shape.last().copied().unwrap_or(1);
            if name.ends_with("attn_q.weight") {
                gv = unpermute_rows(&gv, c.n_heads, c.head_dim, cols);
            } else if name.ends_with("attn_k.weight") {
                gv = unpermute_rows(&gv, c.n_kv_heads, c.head_dim, cols);
            }
        }
        let hv = values(name, ht);
        assert!(gv == hv, "{what}: tensor `{name}` differs");
    }
}

#[test]
fn gguf_and_hf_twins_are_the_same_model() {
    assert_same_model("tiny-llama-f32.gguf", "tiny-llama");
    assert_same_model("tiny-llama-256-f32.gguf", "tiny-llama-256");
    assert_same_model("tiny-llama-spm-f32.gguf", "tiny-llama-spm");
    assert_same_model("tiny-gpt2-f32.gguf", "tiny-gpt2");
}

#[test]
fn f16_gguf_is_the_f32_model_rounded() {
    let f32m = gguf("tiny-gpt2-f32.gguf");
    let f16m = gguf("tiny-gpt2-f16.gguf");
    let (a, b) = (f32m.weights().unwrap(), f16m.weights().unwrap());
    assert_eq!(a.config, b.config);
    let mut saw_f16 = false;
    for (name, t) in &b.tensors {
        let orig = values(name, &a.tensors[name]);
        let got = values(name, t);
        saw_f16 |= t.dtype == DType::F16;
        for (x, y) in orig.iter().zip(&got) {
            // f16 has an 11-bit significand: relative rounding error at most 2^-11
            assert!(
                (x - y).abs() <= x.abs() * 4.9e-4 + 6e-8,
                "{name}: {x} vs {y}"
            );
        }
    }
    assert!(saw_f16);
}

/// Root-mean-square error of the quantized values relative to the RMS of the originals.
fn relative_rmse(orig: &[f32], got: &[f32]) -> f64 {
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for (&x, &y) in orig.iter().zip(got) {
        err += f64::from(x - y).powi(2);
        norm += f64::from(x).powi(2);
    }
    (err / norm.max(1e-30)).sqrt()
}

/// Largest error a block format allows for one block of originals: Q8_0 rounds to steps of
/// amax/127, Q4_1 to steps of (max − min)/15 (half a step each); Q4_0 to steps of amax/8, with
/// one extreme clamped, so a full step.
fn block_bound(dtype: DType, block: &[f32]) -> f32 {
    let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let (lo, hi) = block
        .iter()
        .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
    // allow for the f16 rounding of the stored scale (and minimum) too
    match dtype {
        DType::Q8_0 => amax / 127.0 * 0.5 + amax * 1e-3,
        DType::Q4_0 => amax / 8.0 * 1.0 + amax * 2e-3,
        DType::Q4_1 => (hi - lo) / 15.0 * 0.5 + (hi - lo).abs() * 2e-3 + lo.abs() * 1e-3,
        _ => f32::INFINITY,
    }
}

#[test]
fn quantized_ggufs_stay_within_their_format_error() {
    // (file, f32 twin, largest relative RMSE allowed per quantized type)
    /// Largest relative RMSE allowed, per quantized type present in the file.
    type Bounds = &'static [(DType, f64)];
    let cases: [(&str, &str, Bounds); 6] = [
        (
            "tiny-llama-q8_0.gguf",
            "tiny-llama-f32.gguf",
            &[(DType::Q8_0, 0.01)],
        ),
        (
            "tiny-llama-q4_0.gguf",
            "tiny-llama-f32.gguf",
            &[(DType::Q4_0, 0.15), (DType::Q8_0, 0.01)],
        ),
        (
            "tiny-llama-q4_1.gguf",
            "tiny-llama-f32.gguf",
            &[(DType::Q4_1, 0.12), (DType::Q8_0, 0.01)],
        ),
        (
            "tiny-llama-256-q4_k_m.gguf",
            "tiny-llama-256-f32.gguf",
            &[(DType::Q4_K, 0.12), (DType::Q6_K, 0.03)],
        ),
        (
            "tiny-llama-256-q5_k_m.gguf",
            "tiny-llama-256-f32.gguf",
            &[(DType::Q5_K, 0.06), (DType::Q6_K, 0.03)],
        ),
        (
            "tiny-llama-256-q6_k.gguf",
            "tiny-llama-256-f32.gguf",
            &[(DType::Q6_K, 0.03)],
        ),
    ];
    for (file, twin, bounds) in cases {
        let (q, f) = (gguf(file), gguf(twin));
        let (qw, fw) = (q.weights().unwrap(), f.weights().unwrap());
        assert_eq!(qw.config, fw.config, "{file}");
        let mut seen = std::collections::HashSet::new();
        for (name, t) in &qw.tensors {
            let orig = values(name, &fw.tensors[name]);
            let got = values(name, t);
            if t.dtype == DType::F32 {
                assert_eq!(orig, got, "{file}: {name} is F32 in both");
                continue;
            }
            seen.insert(t.dtype);
            let limit = bounds
                .iter()
                .find(|(d, _)| *d == t.dtype)
                .unwrap_or_else(|| panic!("{file}: unexpected type {} for {name}", t.dtype))
                .1;
            let e = relative_rmse(&orig, &got);
            assert!(
                e <= limit,
                "{file}: {name} ({}) relative RMSE {e:.4} > {limit}",
                t.dtype
            );
            let block = t.dtype.block_elements() as usize;
            for (i, (ob, gb)) in orig.chunks(block).zip(got.chunks(block)).enumerate() {
                let bound = block_bound(t.dtype, ob);
                let worst = ob
                    .iter()
                    .zip(gb)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                assert!(
                    worst <= bound,
                    "{file}: {name} block {i}: error {worst} > {bound}"
                );
            }
        }
        for (d, _) in bounds {
            assert!(seen.contains(d), "{file}: no {d} tensor was checked");
        }
    }
}
