//! Linear layers with fusions against the CPU reference, for every stored weight type, run
//! natively on lavapipe and in the browser on WebGPU: an input norm, an output activation,
//! last-row only, and the stacked Q/K/V projection writing the KV cache (with RoPE). The
//! tolerances are those of `linear_cases`, plus what the fusions add.

use emberlm::backend::gpu::ops::{
    Epilogue, InputNorm, KvWriteBinding, LinearKernel, LinearOptions, NormBinding,
};
use emberlm::backend::gpu::{GpuContext, KernelCache, Reduction, StepParams};
use emberlm::config::{RopeFreqs, RopeLayout, RopeScaling};
use emberlm::dtype::DType;
use emberlm::model::reference;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::linear_cases::{
    every_variant, random_vec, step_buffer, upload_matrix, with_variants, LINEAR_RUNS,
    LINEAR_TOLERANCE,
};

/// One fused configuration: `norm` folded into the input, `epilogue` on the output, and
/// last-row only. The reference normalises in f64, multiplies in f64 and applies the
/// activation in f64; the tolerance scales with Σ|terms| of the product as for plain layers,
/// plus a small absolute term for the norm statistics computed in f32.
#[allow(clippy::too_many_arguments)]
pub async fn check_linear_fused(
    ctx: &GpuContext,
    cache: &KernelCache,
    dtype: DType,
    reduction: Reduction,
    options: LinearOptions,
    shapes: &[(usize, usize)],
    runs: &[(LinearKernel, u32)],
    rng: &mut ChaCha8Rng,
) -> Result<(), String> {
    let what = format!("linear {dtype} {reduction:?} {options:?}");
    let op = every_variant(ctx, cache, dtype, reduction, options, &what).await?;
    let max_tokens = runs.iter().map(|r| r.1).max().unwrap_or(1) as usize;
    let step = step_buffer(ctx);
    let glu = options.epilogue.is_glu();
    for &(rows, cols) in shapes {
        let rows = if glu { rows + rows % 2 } else { rows };
        let what = format!("{what} [{rows}, {cols}]");
        let e = |e: emberlm::Error| format!("{what}: {e}");
        let (w, wv) = upload_matrix(ctx, rng, dtype, rows, cols)?;
        // an offset mean, so that layer norms must subtract it
        let x: Vec<f32> = (0..max_tokens * cols)
            .map(|_| rng.random_range(-1.0..1.0f32) + 0.5)
            .collect();
        let bias = options.has_bias.then(|| random_vec(rng, rows, 1.0));
        let nw = random_vec(rng, cols, 2.0);
        let nb = random_vec(rng, cols, 0.5);
        let eps = 1e-5f32;
        let out_rows = if glu { rows / 2 } else { rows };
        let out_tokens = if options.last_row { 1 } else { max_tokens };
        let y0 = random_vec(rng, out_tokens * out_rows, 1.0);
        let xb = ctx.storage_from("x", &x).map_err(e)?;
        let bb = match &bias {
            Some(b) => Some(ctx.storage_from("bias", b).map_err(e)?),
            None => None,
        };
        let nwb = ctx.storage_from("norm w", &nw).map_err(e)?;
        let nbb = ctx.storage_from("norm b", &nb).map_err(e)?;
        let norm = options.norm.map(|kind| NormBinding {
            weight: &nwb,
            bias: (kind == InputNorm::Layer).then_some(&nbb),
            eps,
        });
        let yb = ctx.storage_from("y", &y0).map_err(e)?;
        let binding = op
            .bind_with_norm(
                ctx,
                &step,
                &w,
                &xb,
                bb.as_ref(),
                norm,
                &yb,
                max_tokens as u32,
            )
            .map_err(e)?;
        for (variant, &(kernel, n_tokens)) in with_variants(runs) {
            let n = n_tokens as usize;
            ctx.queue.write_buffer(&yb, 0, bytemuck::cast_slice(&y0));
            ctx.queue
                .write_buffer(&step, 0, bytemuck::bytes_of(&StepParams::new(0, n_tokens)));
            ctx.submit_pass("linear test", |pass| {
                binding.record_variant(pass, n_tokens, kernel, Some(variant))
            });
            let got = ctx.read_f32(&yb, out_tokens * out_rows).await.map_err(e)?;
            let computed: Vec<usize> = if options.last_row {
                vec![n - 1]
            } else {
                (0..n).collect()
            };
            for ot in 0..out_tokens {
                let got_t = &got[ot * out_rows..(ot + 1) * out_rows];
                let y0_t = &y0[ot * out_rows..(ot + 1) * out_rows];
                let Some(&t) = computed.get(ot) else {
                    if let Some(r) =
                        (0..out_rows).find(|&r| got_t[r].to_bits() != y0_t[r].to_bits())
                    {
                        return Err(format!(
                            "{what} {variant} {kernel:?} n_tokens={n}: row {ot} output {r} written past the computed rows"
                        ));
                    }
                    continue;
                };
                let raw: Vec<f64> = x[t * cols..(t + 1) * cols]
                    .iter()
                    .map(|&v| f64::from(v))
                    .collect();
                let xin: Vec<f64> = match options.norm {
                    None => raw.clone(),
                    Some(kind) => {
                        let mean = match kind {
                            InputNorm::Rms => 0.0,
                            InputNorm::Layer => raw.iter().sum::<f64>() / cols as f64,
                        };
                        let var =
                            raw.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
                        let inv = 1.0 / (var + f64::from(eps)).sqrt();
                        raw.iter()
                            .enumerate()
                            .map(|(c, v)| {
                                let b = if kind == InputNorm::Layer {
                                    f64::from(nb[c])
                                } else {
                                    0.0
                                };
                                (v - mean) * inv * f64::from(nw[c]) + b
                            })
                            .collect()
                    }
                };
                let dot = |r: usize| -> (f64, f64) {
                    let row = &wv[r * cols..(r + 1) * cols];
                    let mut s = 0.0;
                    let mut m = 0.0;
                    for (a, b) in row.iter().zip(&xin) {
                        s += f64::from(*a) * b;
                        m += (f64::from(*a) * b).abs();
                    }
                    let b = bias.as_ref().map_or(0.0, |b| f64::from(b[r]));
                    (s + b, m + b.abs())
                };
                for r in 0..out_rows {
                    let (want, magnitude) = match options.epilogue {
                        Epilogue::None => {
                            let (v, m) = dot(r);
                            if options.accumulate {
                                (v + f64::from(y0_t[r]), m + f64::from(y0_t[r]).abs())
                            } else {
                                (v, m)
                            }
                        }
                        Epilogue::Gelu => {
                            let (v, m) = dot(r);
                            let u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
                            (0.5 * v * (1.0 + u.tanh()), m)
                        }
                        Epilogue::GeluErf => {
                            let (v, m) = dot(r);
                            let phi = 0.5 * (1.0 + libm::erf(v * std::f64::consts::FRAC_1_SQRT_2));
                            (v * phi, m)
                        }
                        Epilogue::SwiGlu | Epilogue::GeGlu => {
                            let (g, mg) = dot(2 * r);
                            let (u, mu) = dot(2 * r + 1);
                            let s = match options.epilogue {
                                Epilogue::GeGlu => {
                                    let k = 0.7978845608028654 * (g + 0.044715 * g * g * g);
                                    0.5 * g * (1.0 + k.tanh())
                                }
                                _ => g / (1.0 + (-g).exp()),
                            };
                            // |d silu| ≤ 1.1: the gate's error passes through scaled by |up|
                            (s * u, mg * u.abs() * 1.1 + mu * s.abs())
                        }
                    };
                    let tol = LINEAR_TOLERANCE * magnitude * 4.0 + 1e-5;
                    let diff = (f64::from(got_t[r]) - want).abs();
                    let within = diff <= tol;
                    if !within {
                        return Err(format!(
                            "{what} {variant} {kernel:?} n_tokens={n}: token {t} output {r}: gpu {} vs reference {want} (|diff| {diff:e} > tol {tol:e})",
                            got_t[r]
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The fused configurations the forward graph uses, plus their neighbours.
pub fn fused_options() -> Vec<LinearOptions> {
    let base = LinearOptions::default();
    vec![
        LinearOptions {
            norm: Some(InputNorm::Rms),
            ..base
        },
        LinearOptions {
            norm: Some(InputNorm::Layer),
            has_bias: true,
            ..base
        },
        LinearOptions {
            norm: Some(InputNorm::Rms),
            epilogue: Epilogue::SwiGlu,
            ..base
        },
        LinearOptions {
            epilogue: Epilogue::SwiGlu,
            has_bias: true,
            ..base
        },
        LinearOptions {
            norm: Some(InputNorm::Rms),
            epilogue: Epilogue::GeGlu,
            ..base
        },
        LinearOptions {
            norm: Some(InputNorm::Layer),
            epilogue: Epilogue::Gelu,
            has_bias: true,
            ..base
        },
        LinearOptions {
            epilogue: Epilogue::GeluErf,
            has_bias: true,
            ..base
        },
        LinearOptions {
            norm: Some(InputNorm::Rms),
            last_row: true,
            ..base
        },
        LinearOptions {
            last_row: true,
            has_bias: true,
            ..base
        },
    ]
}

/// A stacked Q/K/V projection writing the KV cache (with and without RoPE, with an RMS norm
/// and a bias): `y` holds q (rotated) | k (rotated) | v, and cache rows `pos0 .. pos0 + n`
/// hold k and v while every other cache row stays as it was. Heads of 6 values (3 pairs),
/// 3 query heads and 1 KV head; positions from 1000 on so the angles are large.
pub async fn check_linear_qkv(
    ctx: &GpuContext,
    cache: &KernelCache,
    dtype: DType,
    reduction: Reduction,
    rng: &mut ChaCha8Rng,
) -> Result<(), String> {
    let (n_heads, n_kv, hd, theta, positions) = (3usize, 1usize, 6usize, 10000.0f32, 1040usize);
    // Llama 3's scaling with an original context of 512: of the 3 pairs, the first keeps its
    // frequency, the second is blended, the third divided by the factor
    let freqs = RopeFreqs {
        theta,
        scaling: RopeScaling::Llama3 {
            factor: 4.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_context: 512,
        },
    };
    let (q_rows, kv_rows) = (n_heads * hd, n_kv * hd);
    let rows = q_rows + 2 * kv_rows;
    let cols = match dtype.block_elements() {
        1 => 45,
        32 => 96,
        _ => 256,
    };
    for rope in [true, false] {
        let options = LinearOptions {
            has_bias: true,
            norm: Some(InputNorm::Rms),
            kv_write: true,
            rope,
            ..LinearOptions::default()
        };
        let what = format!("linear qkv {dtype} {reduction:?} rope={rope}");
        let e = |e: emberlm::Error| format!("{what}: {e}");
        let op = every_variant(ctx, cache, dtype, reduction, options, &what).await?;
        let max_tokens = 17usize;
        let (w, wv) = upload_matrix(ctx, rng, dtype, rows, cols)?;
        let x = random_vec(rng, max_tokens * cols, 1.0);
        let bias = random_vec(rng, rows, 0.5);
        let nw = random_vec(rng, cols, 2.0);
        let kc0 = random_vec(rng, positions * kv_rows, 1.0);
        let vc0 = random_vec(rng, positions * kv_rows, 1.0);
        let step = step_buffer(ctx);
        let xb = ctx.storage_from("x", &x).map_err(e)?;
        let bb = ctx.storage_from("bias", &bias).map_err(e)?;
        let nwb = ctx.storage_from("norm w", &nw).map_err(e)?;
        let yb = ctx
            .storage_zeroed("y", (max_tokens * rows * 4) as u64)
            .map_err(e)?;
        let kb = ctx.storage_from("k cache", &kc0).map_err(e)?;
        let vb = ctx.storage_from("v cache", &vc0).map_err(e)?;
        let norm = NormBinding {
            weight: &nwb,
            bias: None,
            eps: 1e-6,
        };
        let kv = KvWriteBinding {
            caches: Some((&kb, &vb)),
            q_rows: q_rows as u32,
            kv_rows: kv_rows as u32,
            head_dim: hd as u32,
            rope: &freqs,
            max_positions: positions as u32,
            ring: None,
        };
        let binding = op
            .bind_qkv(
                ctx,
                &step,
                &w,
                &xb,
                Some(&bb),
                Some(norm),
                Some(kv),
                &yb,
                max_tokens as u32,
            )
            .map_err(e)?;
        for (variant, &(kernel, n_tokens)) in with_variants(LINEAR_RUNS) {
            let (n, pos0) = (n_tokens as usize, 1000 + n_tokens as usize);
            ctx.queue.write_buffer(&kb, 0, bytemuck::cast_slice(&kc0));
            ctx.queue.write_buffer(&vb, 0, bytemuck::cast_slice(&vc0));
            ctx.queue.write_buffer(
                &step,
                0,
                bytemuck::bytes_of(&StepParams::new(pos0 as u32, n_tokens)),
            );
            ctx.submit_pass("linear qkv test", |pass| {
                binding.record_variant(pass, n_tokens, kernel, Some(variant))
            });
            let y = ctx.read_f32(&yb, max_tokens * rows).await.map_err(e)?;
            let kc = ctx.read_f32(&kb, positions * kv_rows).await.map_err(e)?;
            let vc = ctx.read_f32(&vb, positions * kv_rows).await.map_err(e)?;
            for p in (0..positions).filter(|p| !(pos0..pos0 + n).contains(p)) {
                let range = p * kv_rows..(p + 1) * kv_rows;
                if kc[range.clone()] != kc0[range.clone()] || vc[range.clone()] != vc0[range] {
                    return Err(format!(
                        "{what} {variant} {kernel:?} n={n}: cache row {p} written"
                    ));
                }
            }
            for t in 0..n {
                let layout = if rope {
                    RopeLayout::Interleaved
                } else {
                    RopeLayout::None
                };
                let heads = QkvHeads { n_heads, n_kv, hd };
                let pos = pos0 + t;
                let (want, tol) = qkv_reference(
                    &x[t * cols..(t + 1) * cols],
                    &nw,
                    (&wv, &bias),
                    heads,
                    (pos, &freqs, layout),
                );
                let check = |got: f32, want: f32, at: String| -> Result<(), String> {
                    let diff = (f64::from(got) - f64::from(want)).abs();
                    if diff <= tol {
                        Ok(())
                    } else {
                        Err(format!(
                            "{what} {variant} {kernel:?} n={n} token {t} {at}: gpu {got} vs reference {want} (|diff| {diff:e} > {tol:e})"
                        ))
                    }
                };
                for r in 0..rows {
                    check(y[t * rows + r], want[r], format!("y row {r}"))?;
                }
                for j in 0..kv_rows {
                    check(
                        kc[pos * kv_rows + j],
                        want[q_rows + j],
                        format!("k cache {j}"),
                    )?;
                    check(
                        vc[pos * kv_rows + j],
                        want[q_rows + kv_rows + j],
                        format!("v cache {j}"),
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// Heads of a stacked Q/K/V projection: `n_heads` query and `n_kv` key/value heads of `hd`.
#[derive(Debug, Clone, Copy)]
pub struct QkvHeads {
    pub n_heads: usize,
    pub n_kv: usize,
    pub hd: usize,
}

/// The reference output of a stacked Q/K/V projection for one token and its tolerance: the
/// input `raw` RMS-normalised in f64 (weight `nw`, eps 1e-6), `W·x + bias` in f64 with
/// `(w, bias)` as values, q and k rotated at `rope`'s position. The tolerance scales with
/// Σ|x| as for plain layers.
pub fn qkv_reference(
    raw: &[f32],
    nw: &[f32],
    (w, bias): (&[f32], &[f32]),
    heads: QkvHeads,
    rope: (usize, &RopeFreqs, RopeLayout),
) -> (Vec<f32>, f64) {
    let QkvHeads { n_heads, n_kv, hd } = heads;
    let (pos, freqs, layout) = rope;
    let cols = raw.len();
    let (q_rows, kv_rows) = (n_heads * hd, n_kv * hd);
    let ms = raw
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        / cols as f64;
    let inv = 1.0 / (ms + 1e-6).sqrt();
    let xin: Vec<f32> = raw
        .iter()
        .zip(nw)
        .map(|(&v, &g)| (f64::from(v) * inv * f64::from(g)) as f32)
        .collect();
    let mut want = reference::matvec(w, &xin, Some(bias), q_rows + 2 * kv_rows, cols);
    reference::rope(&mut want[..q_rows], n_heads, hd, pos, freqs, layout);
    let k = &mut want[q_rows..q_rows + kv_rows];
    reference::rope(k, n_kv, hd, pos, freqs, layout);
    let magnitude: f64 = xin.iter().map(|v| f64::from(v.abs())).sum::<f64>() * 0.2 + 1.0;
    (want, 1e-5 * magnitude * 4.0)
}
