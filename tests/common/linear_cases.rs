//! Linear-layer and embedding kernels against the CPU reference, for every stored weight type,
//! run natively on lavapipe and in the browser on WebGPU.
//!
//! Weights are random block bytes with sane finite scales (some of them subnormal f16); the
//! reference dequantizes them with `model::weights::dequantize` and takes f64 dot products
//! (`model::reference::matvec`). Linear results must be within `LINEAR_TOLERANCE` × Σ|terms|
//! (Σ_c |w·x| + |bias| + |y before|) of the reference; embeddings must match bit for bit.

use std::borrow::Cow;

use emberlm::backend::gpu::ops::{EmbedSource, Embedding, Linear, LinearKernel, LinearOptions};
use emberlm::backend::gpu::variants::linear as linear_variants;
use emberlm::backend::gpu::{
    GpuContext, GpuTensor, KernelCache, MatmulPrecision, Reduction, StepParams, Variant,
};
use emberlm::dtype::{dequantize, DType};
use emberlm::model::reference;
use emberlm::model::weights::Tensor;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Relative tolerance of a linear output, against the sum of the magnitudes of its terms:
/// f32 accumulation over a few thousand terms, in a different order from the f64 reference,
/// stays far below it.
pub const LINEAR_TOLERANCE: f64 = 1e-5;

/// Under precision f16, the further slack per product, relative to its magnitude: f16's unit
/// roundoff (half an ulp, 2^-11). The reference rounds every product of two f16 values to f16
/// as WGSL's f16 multiply defines; a driver may keep the (exactly representable) product in f32
/// instead (NVIDIA's Vulkan driver on an H200 does: 9.3e-4 apart over 13 terms summing to 8.7),
/// which differs from the rounded one by at most this much.
pub const F16_PRODUCT_ROUNDING: f64 = 1.0 / 2048.0;

/// A f16 scale: finite, 1e-3 to 1e-1 in magnitude, either sign; subnormal (below 2^-14)
/// when `subnormal`, to check that kernels do not flush them.
fn random_scale(rng: &mut ChaCha8Rng, subnormal: bool) -> [u8; 2] {
    let sign = if rng.random_bool(0.5) { 0x8000u16 } else { 0 };
    let bits = if subnormal {
        sign | rng.random_range(1u16..0x0400)
    } else {
        let v: f32 = 10f32.powf(rng.random_range(-3.0..-1.0));
        sign | half::f16::from_f32(v).to_bits()
    };
    bits.to_le_bytes()
}

/// The stored bytes of `n` random values of `dtype`: random block bytes with random finite
/// scales, every fifth block's scales subnormal; float types get values of a few magnitudes,
/// F16 some subnormal ones.
pub fn random_weights(rng: &mut ChaCha8Rng, dtype: DType, n: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    match dtype {
        DType::F32 => {
            for _ in 0..n {
                let v = rng.random_range(-1.0f32..1.0) * 10f32.powi(rng.random_range(-2..2));
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        DType::F16 => {
            for i in 0..n {
                let v = if i % 7 == 3 {
                    rng.random_range(-6e-5f32..6e-5) // subnormal in f16
                } else {
                    rng.random_range(-2.0f32..2.0)
                };
                bytes.extend_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
        }
        DType::BF16 => {
            for _ in 0..n {
                let v = rng.random_range(-1.0f32..1.0) * 10f32.powi(rng.random_range(-2..2));
                bytes.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes());
            }
        }
        _ => {
            let block = dtype.block_bytes() as usize;
            let blocks = n / dtype.block_elements() as usize;
            bytes.resize(blocks * block, 0);
            rng.fill(bytes.as_mut_slice());
            // Offsets of the f16 scales in the block.
            let scales: &[usize] = match dtype {
                DType::Q8_0 | DType::Q4_0 | DType::Q5_0 => &[0],
                DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
                DType::Q6_K => &[208],
                _ => unreachable!("float types handled above"),
            };
            for (i, b) in bytes.chunks_exact_mut(block).enumerate() {
                for &at in scales {
                    b[at..at + 2].copy_from_slice(&random_scale(rng, i % 5 == 2));
                }
            }
        }
    }
    bytes
}

/// A `[rows, cols]` tensor of `dtype` on the GPU and its dequantized values.
pub fn upload_matrix(
    ctx: &GpuContext,
    rng: &mut ChaCha8Rng,
    dtype: DType,
    rows: usize,
    cols: usize,
) -> Result<(GpuTensor, Vec<f32>), String> {
    let bytes = random_weights(rng, dtype, rows * cols);
    let values = dequantize(dtype, &bytes, (rows * cols) as u64, "w").map_err(|e| e.to_string())?;
    let tensor = Tensor {
        shape: vec![rows, cols],
        dtype,
        data: Cow::Owned(bytes),
    };
    let w = GpuTensor::upload(ctx, "w", &tensor).map_err(|e| e.to_string())?;
    Ok((w, values))
}

pub(crate) fn random_vec(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// The step uniform, writable so that one binding serves every token count.
/// `options`' linear for `dtype` built in every variant (the cases run each), errors prefixed
/// with `what`.
pub async fn every_variant(
    ctx: &GpuContext,
    cache: &KernelCache,
    dtype: DType,
    reduction: Reduction,
    options: LinearOptions,
    what: &str,
) -> Result<Linear, String> {
    Linear::with_variants(
        ctx,
        cache,
        dtype,
        reduction,
        options,
        &variants_of(LinearKernel::Decode),
        &variants_of(LinearKernel::Prefill),
    )
    .await
    .map_err(|e| format!("{what}: {e}"))
}

pub fn step_buffer(ctx: &GpuContext) -> wgpu::Buffer {
    StepParams::create_buffer(ctx, "step")
}

/// `(rows, cols)` of the linear cases for `dtype`: rows not multiples of the 4 rows of a decode
/// workgroup nor of the 64 of a prefill tile; cols odd numbers of blocks (odd numbers of values
/// for the float types, so their rows start mid-word), some wider than one pass of a decode
/// workgroup (64 parts of 8).
pub fn linear_shapes(dtype: DType, small: bool) -> Vec<(usize, usize)> {
    let b = dtype.block_elements() as usize;
    let shapes: &[(usize, usize)] = match (b, small) {
        (1, false) => &[(1, 1), (3, 13), (37, 1001), (130, 75)],
        (1, true) => &[(3, 13), (37, 75)],
        (32, false) => &[(1, 32), (3, 96), (37, 33 * 32), (130, 160)],
        (32, true) => &[(3, 96), (37, 160)],
        (_, false) => &[(1, 256), (3, 768), (37, 5 * 256), (130, 256)],
        (_, true) => &[(3, 256), (37, 768)],
    };
    shapes.to_vec()
}

/// Every variant the kernel's table declares.
pub fn variants_of(kernel: LinearKernel) -> Vec<Variant> {
    let table = match kernel {
        LinearKernel::Decode => linear_variants::DECODE,
        LinearKernel::Prefill => linear_variants::PREFILL,
    };
    table.iter().map(|v| v.spec.variant).collect()
}

/// Every run in every variant its kernel's table declares: each must match.
pub fn with_variants(
    runs: &[(LinearKernel, u32)],
) -> impl Iterator<Item = (Variant, &(LinearKernel, u32))> {
    runs.iter()
        .flat_map(|r| variants_of(r.0).into_iter().map(move |v| (v, r)))
}

/// The kernel and token count of each run: decode for one token, prefill for 1 to 17.
pub const LINEAR_RUNS: &[(LinearKernel, u32)] = &[
    (LinearKernel::Decode, 1),
    (LinearKernel::Prefill, 1),
    (LinearKernel::Prefill, 2),
    (LinearKernel::Prefill, 5),
    (LinearKernel::Prefill, 17),
];

/// One linear configuration on the given shapes and runs. `y` starts random so that both the
/// accumulated result and the untouched rows past `n_tokens` are checked.
#[allow(clippy::too_many_arguments)]
pub async fn check_linear(
    ctx: &GpuContext,
    cache: &KernelCache,
    dtype: DType,
    reduction: Reduction,
    has_bias: bool,
    accumulate: bool,
    shapes: &[(usize, usize)],
    runs: &[(LinearKernel, u32)],
    rng: &mut ChaCha8Rng,
) -> Result<(), String> {
    let what = format!("linear {dtype} {reduction:?} bias={has_bias} accumulate={accumulate}");
    let options = LinearOptions {
        has_bias,
        accumulate,
        ..LinearOptions::default()
    };
    let op = every_variant(ctx, cache, dtype, reduction, options, &what).await?;
    // precision f16: the reference rounds the inputs and the products as the kernels do
    let f16 = ctx.precision() == MatmulPrecision::F16;
    let max_tokens = runs.iter().map(|r| r.1).max().unwrap_or(1) as usize;
    let step = step_buffer(ctx);
    for &(rows, cols) in shapes {
        let what = format!("{what} [{rows}, {cols}]");
        let e = |e: emberlm::Error| format!("{what}: {e}");
        let (w, wv) = upload_matrix(ctx, rng, dtype, rows, cols)?;
        let x = random_vec(rng, max_tokens * cols, 1.0);
        let bias = has_bias.then(|| random_vec(rng, rows, 1.0));
        let y0 = random_vec(rng, max_tokens * rows, 1.0);
        let xb = ctx.storage_from("x", &x).map_err(e)?;
        let bb = match &bias {
            Some(b) => Some(ctx.storage_from("bias", b).map_err(e)?),
            None => None,
        };
        let yb = ctx.storage_from("y", &y0).map_err(e)?;
        let binding = op
            .bind(ctx, &step, &w, &xb, bb.as_ref(), &yb, max_tokens as u32)
            .map_err(e)?;
        for (variant, &(kernel, n_tokens)) in with_variants(runs) {
            let n = n_tokens as usize;
            ctx.queue.write_buffer(&yb, 0, bytemuck::cast_slice(&y0));
            ctx.queue
                .write_buffer(&step, 0, bytemuck::bytes_of(&StepParams::new(0, n_tokens)));
            ctx.submit_pass("linear test", |pass| {
                binding.record_variant(pass, n_tokens, kernel, Some(variant))
            });
            let got = ctx.read_f32(&yb, max_tokens * rows).await.map_err(e)?;
            for t in 0..max_tokens {
                let y0_t = &y0[t * rows..(t + 1) * rows];
                let got_t = &got[t * rows..(t + 1) * rows];
                if t >= n {
                    if let Some(r) = (0..rows).find(|&r| got_t[r].to_bits() != y0_t[r].to_bits()) {
                        return Err(format!(
                            "{what} {variant} {kernel:?} n_tokens={n}: token {t} row {r} written ({} -> {}) past n_tokens",
                            y0_t[r], got_t[r]
                        ));
                    }
                    continue;
                }
                let x_t = &x[t * cols..(t + 1) * cols];
                let dots = if f16 {
                    f16_matvec(&wv, x_t, bias.as_deref(), rows, cols)
                } else {
                    reference::matvec(&wv, x_t, bias.as_deref(), rows, cols)
                };
                for r in 0..rows {
                    let row = &wv[r * cols..(r + 1) * cols];
                    let mut magnitude: f64 = row
                        .iter()
                        .zip(x_t)
                        .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
                        .sum();
                    magnitude += bias.as_ref().map_or(0.0, |b| f64::from(b[r]).abs());
                    let mut want = f64::from(dots[r]);
                    if accumulate {
                        want += f64::from(y0_t[r]);
                        magnitude += f64::from(y0_t[r]).abs();
                    }
                    let mut tol = LINEAR_TOLERANCE * magnitude;
                    if f16 {
                        let products: f64 = row
                            .iter()
                            .zip(x_t)
                            .map(|(&a, &b)| f64::from(to_f16(a) * to_f16(b)).abs())
                            .sum();
                        tol += F16_PRODUCT_ROUNDING * products;
                    }
                    let diff = (f64::from(got_t[r]) - want).abs();
                    // written so that a NaN from the GPU fails too
                    let within = diff <= tol;
                    if !within {
                        return Err(format!(
                            "{what} {variant} {kernel:?} n_tokens={n}: token {t} row {r}: gpu {} vs reference {want} (|diff| {diff:e} > tol {tol:e})",
                            got_t[r]
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// `v` rounded to f16 as the kernels' `mm_h4` does (clamped to the finite range first).
pub fn to_f16(v: f32) -> f32 {
    half::f16::from_f32(v.clamp(-65504.0, 65504.0)).to_f32()
}

/// `w · x + bias` under precision f16: each product of f16-rounded inputs rounded to f16 (an
/// f16 multiply: the f32 product of two f16 is exact, so one rounding gives its result), the
/// products summed in f64. `w: [rows, cols]`, `x: [cols]`.
pub fn f16_matvec(
    w: &[f32],
    x: &[f32],
    bias: Option<&[f32]>,
    rows: usize,
    cols: usize,
) -> Vec<f32> {
    (0..rows)
        .map(|r| {
            let row = &w[r * cols..(r + 1) * cols];
            let sum: f64 = row
                .iter()
                .zip(x)
                .map(|(&a, &b)| f64::from(to_f16(to_f16(a) * to_f16(b))))
                .sum();
            (sum + bias.map_or(0.0, |b| f64::from(b[r]))) as f32
        })
        .collect()
}

/// Every (bias, accumulate) pair.
pub const BIAS_ACCUMULATE: [(bool, bool); 4] =
    [(false, false), (true, false), (false, true), (true, true)];

/// A vocabulary-sized output (an LM head: 50000 rows) with both kernels, a decode whose 65537
/// workgroups spill into the grid's y dimension, a prefill of two token tiles (40 tokens) and
/// the decode kernel given several tokens.
pub async fn check_linear_large(
    ctx: &GpuContext,
    cache: &KernelCache,
    reduction: Reduction,
    rng: &mut ChaCha8Rng,
) -> Result<(), String> {
    check_linear(
        ctx,
        cache,
        DType::Q8_0,
        reduction,
        false,
        false,
        &[(50_000, 64)],
        &[(LinearKernel::Decode, 1), (LinearKernel::Prefill, 5)],
        rng,
    )
    .await?;
    check_linear(
        ctx,
        cache,
        DType::Q4_0,
        reduction,
        true,
        false,
        &[(262_147, 32)],
        &[(LinearKernel::Decode, 1)],
        rng,
    )
    .await?;
    check_linear(
        ctx,
        cache,
        DType::Q6_K,
        reduction,
        true,
        true,
        &[(70, 512)],
        &[(LinearKernel::Prefill, 40), (LinearKernel::Decode, 3)],
        rng,
    )
    .await
}

fn expect<T>(r: emberlm::Result<T>, name: &str) -> Result<(), String> {
    match r {
        Ok(_) => Err(format!("expected an error naming `{name}`")),
        Err(e) if e.to_string().contains(&format!("`{name}`")) => Ok(()),
        Err(e) => Err(format!("expected an error naming `{name}`, got: {e}")),
    }
}

/// Bad arguments are errors naming the argument, before anything is dispatched.
pub async fn check_linear_errors(ctx: &GpuContext, cache: &KernelCache) -> Result<(), String> {
    let op = Linear::new(ctx, cache, DType::Q8_0, Reduction::Workgroup, false, false)
        .await
        .map_err(|e| e.to_string())?;
    let step = step_buffer(ctx);
    let buf = |bytes: u64| ctx.storage_zeroed("b", bytes).map_err(|e| e.to_string());
    let matrix = |shape: Vec<usize>, dtype: DType, bytes: u64| -> Result<GpuTensor, String> {
        Ok(GpuTensor {
            buffer: buf(bytes)?,
            first_rows: shape[0] as u32,
            shape,
            dtype,
            rest: Vec::new(),
        })
    };
    let good = matrix(vec![3, 64], DType::Q8_0, 3 * 2 * 34)?;
    let (x, y) = (buf(2 * 64 * 4)?, buf(2 * 3 * 4)?);
    op.bind(ctx, &step, &good, &x, None, &y, 2)
        .map_err(|e| e.to_string())?;
    expect(op.bind(ctx, &step, &good, &x, None, &y, 3), "x")?;
    expect(op.bind(ctx, &step, &good, &y, None, &x, 2), "x")?;
    expect(op.bind(ctx, &step, &good, &x, None, &x, 2), "y")?;
    expect(op.bind(ctx, &step, &good, &x, Some(&x), &y, 2), "bias")?;
    expect(op.bind(ctx, &step, &good, &x, None, &y, 0), "max_tokens")?;
    let small_step = buf(8)?;
    expect(op.bind(ctx, &small_step, &good, &x, None, &y, 2), "step")?;
    let cases = [
        matrix(vec![3, 48], DType::Q8_0, 1024)?, // not a whole number of blocks
        matrix(vec![3, 64], DType::Q4_0, 1024)?, // wrong type
        matrix(vec![3, 64], DType::Q8_0, 3 * 2 * 34 - 4)?, // buffer too small
        matrix(vec![192], DType::Q8_0, 1024)?,   // not a matrix
        matrix(vec![0, 64], DType::Q8_0, 1024)?, // empty
    ];
    for w in &cases {
        expect(op.bind(ctx, &step, w, &x, None, &y, 2), "w")?;
    }
    let embed = Embedding::new(ctx, cache, DType::Q8_0, EmbedSource::Tokens, false)
        .await
        .map_err(|e| e.to_string())?;
    let out = buf(2 * 64 * 4)?;
    let ids = buf(8)?;
    embed
        .bind(ctx, &step, &good, Some(&ids), &out, 2)
        .map_err(|e| e.to_string())?;
    expect(embed.bind(ctx, &step, &good, None, &out, 2), "ids")?;
    expect(embed.bind(ctx, &step, &good, Some(&ids), &out, 3), "out")?;
    expect(
        embed.bind(ctx, &step, &cases[0], Some(&ids), &out, 2),
        "table",
    )?;
    expect(embed.bind(ctx, &step, &good, Some(&ids), &ids, 2), "out")?;
    // The good bindings above left no validation error behind.
    ctx.check().map_err(|e| e.to_string())
}

/// `(rows, dim)` of the embedding table for `dtype`: a few whole blocks per row (an odd number
/// of values, so rows start mid-word, for the float types).
pub fn embed_shape(dtype: DType) -> (usize, usize) {
    match dtype.block_elements() {
        1 => (7, 37),
        32 => (7, 96),
        _ => (7, 512),
    }
}

/// One embedding configuration: 5 tokens with one id past the table (Tokens) or positions
/// from 3 running past the table's 7 rows (Positions), compared bit for bit.
pub async fn check_embedding(
    ctx: &GpuContext,
    cache: &KernelCache,
    dtype: DType,
    source: EmbedSource,
    accumulate: bool,
    rng: &mut ChaCha8Rng,
) -> Result<(), String> {
    let what = format!("embed {dtype} {source:?} accumulate={accumulate}");
    let e = |e: emberlm::Error| format!("{what}: {e}");
    let op = Embedding::new(ctx, cache, dtype, source, accumulate)
        .await
        .map_err(e)?;
    let (rows, dim) = embed_shape(dtype);
    let (table, values) = upload_matrix(ctx, rng, dtype, rows, dim)?;
    let (max_tokens, n_tokens, pos0) = (6usize, 5usize, 3u32);
    let mut ids: Vec<u32> = (0..max_tokens)
        .map(|_| rng.random_range(0..rows as u32))
        .collect();
    ids[2] = rows as u32 + 1000; // clamped to the last row
    let out0 = random_vec(rng, max_tokens * dim, 1.0);
    let step = step_buffer(ctx);
    ctx.queue.write_buffer(
        &step,
        0,
        bytemuck::bytes_of(&StepParams::new(pos0, n_tokens as u32)),
    );
    let idb = ctx.storage_from("ids", &ids).map_err(e)?;
    let out = ctx.storage_from("out", &out0).map_err(e)?;
    let id_buffer = (source == EmbedSource::Tokens).then_some(&idb);
    let binding = op
        .bind(ctx, &step, &table, id_buffer, &out, max_tokens as u32)
        .map_err(e)?;
    ctx.submit_pass("embed test", |pass| binding.record(pass, n_tokens as u32));
    let got = ctx.read_f32(&out, max_tokens * dim).await.map_err(e)?;
    for t in 0..max_tokens {
        let id = match source {
            EmbedSource::Tokens => ids[t] as usize,
            EmbedSource::Positions => pos0 as usize + t,
            EmbedSource::First => 0,
        }
        .min(rows - 1);
        for c in 0..dim {
            let before = out0[t * dim + c];
            let want = if t >= n_tokens {
                before
            } else if accumulate {
                before + values[id * dim + c]
            } else {
                values[id * dim + c]
            };
            let g = got[t * dim + c];
            if g.to_bits() != want.to_bits() {
                return Err(format!(
                    "{what}: token {t} (row {id}) column {c}: gpu {g:e} ({:#010x}) vs {want:e} ({:#010x})",
                    g.to_bits(),
                    want.to_bits()
                ));
            }
        }
    }
    Ok(())
}
