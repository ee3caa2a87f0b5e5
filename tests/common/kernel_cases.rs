//! Kernel-vs-CPU-reference cases, run natively on lavapipe and in the browser on WebGPU.
//! Sizes are deliberately not multiples of the workgroup size or of the rows per workgroup.

use emberlm::gpu::{GpuContext, KernelCache, MatVecF32, Reduction, RmsNorm, StepParams};
use emberlm::model::reference;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

fn random_vec(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// Both reductions where the device has subgroups, the workgroup tree otherwise.
pub fn reductions(ctx: &GpuContext) -> Vec<Reduction> {
    let mut r = vec![Reduction::Workgroup];
    if ctx.has_subgroups() {
        r.push(Reduction::Subgroup);
    }
    r
}

/// `(rows, cols)` pairs for matvec: tiny, odd, wider than a workgroup, and one with more than
/// 65535 workgroups so the dispatch spills into y.
pub const MATVEC_SHAPES: &[(u32, u32)] = &[
    (1, 1),
    (3, 5),
    (7, 300),
    (257, 13),
    (130, 1031),
    (33, 4099),
    (262_147, 2),
];

/// Runs `y = W·x (+ bias)` on the GPU for every shape and compares with the f64 reference.
pub async fn check_matvec(
    ctx: &GpuContext,
    cache: &KernelCache,
    reduction: Reduction,
    has_bias: bool,
    rng: &mut ChaCha8Rng,
) -> Result<(), String> {
    let op = MatVecF32::new(ctx, cache, reduction, has_bias)
        .await
        .map_err(|e| e.to_string())?;
    for &(rows, cols) in MATVEC_SHAPES {
        let (r, c) = (rows as usize, cols as usize);
        let w = random_vec(rng, r * c, 1.0);
        let x = random_vec(rng, c, 1.0);
        let bias = has_bias.then(|| random_vec(rng, r, 1.0));
        let expect = reference::matvec(&w, &x, bias.as_deref(), r, c);

        let e = |e: emberlm::Error| format!("{rows}x{cols}: {e}");
        let wb = ctx.storage_from("w", &w).map_err(e)?;
        let xb = ctx.storage_from("x", &x).map_err(e)?;
        let bb = match &bias {
            Some(b) => Some(ctx.storage_from("bias", b).map_err(e)?),
            None => None,
        };
        let yb = ctx.storage_zeroed("y", r as u64 * 4).map_err(e)?;
        let binding = op
            .bind(ctx, &wb, &xb, bb.as_ref(), &yb, rows, cols)
            .map_err(e)?;
        ctx.submit_pass("matvec test", |pass| binding.record(pass, 1));
        let got = ctx.read_f32(&yb, r).await.map_err(e)?;

        for i in 0..r {
            let row = &w[i * c..(i + 1) * c];
            let magnitude: f32 = row.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum::<f32>()
                + bias.as_ref().map_or(0.0, |b| b[i].abs());
            let tol = 1e-5 * magnitude + 1e-6;
            let diff = (got[i] - expect[i]).abs();
            // written so that a NaN from the GPU fails too
            let within = diff <= tol;
            if !within {
                return Err(format!(
                    "matvec {reduction:?} bias={has_bias} {rows}x{cols}: row {i}: gpu {} vs reference {} (|diff| {diff:e} > tol {tol:e})",
                    got[i], expect[i]
                ));
            }
        }
    }
    Ok(())
}

/// `(n_rows, n)` pairs for RMSNorm (576 is SmolLM2's hidden size).
pub const RMS_NORM_SHAPES: &[(u32, u32)] = &[(1, 1), (3, 7), (2, 576), (5, 1031), (1, 4097)];

/// Runs RMSNorm on the GPU for every shape and compares with the f64 reference.
pub async fn check_rms_norm(
    ctx: &GpuContext,
    cache: &KernelCache,
    reduction: Reduction,
    rng: &mut ChaCha8Rng,
) -> Result<(), String> {
    let op = RmsNorm::new(ctx, cache, reduction)
        .await
        .map_err(|e| e.to_string())?;
    let eps = 1e-5;
    for &(n_rows, n) in RMS_NORM_SHAPES {
        let (rows, len) = (n_rows as usize, n as usize);
        let x = random_vec(rng, rows * len, 3.0);
        let weight = random_vec(rng, len, 2.0);
        let expect = reference::rms_norm(&x, &weight, len, eps);

        let e = |e: emberlm::Error| format!("{n_rows}x{n}: {e}");
        let xb = ctx.storage_from("x", &x).map_err(e)?;
        let wb = ctx.storage_from("weight", &weight).map_err(e)?;
        let yb = ctx
            .storage_zeroed("y", (rows * len) as u64 * 4)
            .map_err(e)?;
        // every row is a token of one step
        let step = StepParams::create_buffer(ctx, "step");
        StepParams::new(0, n_rows).write(ctx, &step);
        let binding = op
            .bind(ctx, &step, &xb, &wb, &yb, n, eps, n_rows)
            .map_err(e)?;
        ctx.submit_pass("rms_norm test", |pass| binding.record(pass, n_rows));
        let got = ctx.read_f32(&yb, rows * len).await.map_err(e)?;

        for (i, (&g, &want)) in got.iter().zip(&expect).enumerate() {
            let tol = 1e-5 * (want.abs() + 1.0);
            let diff = (g - want).abs();
            // written so that a NaN from the GPU fails too
            let within = diff <= tol;
            if !within {
                return Err(format!(
                    "rms_norm {reduction:?} {n_rows}x{n}: element {i}: gpu {g} vs reference {want} (|diff| {diff:e} > tol {tol:e})"
                ));
            }
        }
    }
    Ok(())
}

/// The subgroup reduction orders its partials, so repeated runs give identical bits.
pub async fn check_matvec_deterministic(
    ctx: &GpuContext,
    cache: &KernelCache,
    reduction: Reduction,
    rng: &mut ChaCha8Rng,
) -> Result<(), String> {
    let (rows, cols) = (61u32, 2053u32);
    let op = MatVecF32::new(ctx, cache, reduction, false)
        .await
        .map_err(|e| e.to_string())?;
    let w = random_vec(rng, (rows * cols) as usize, 1.0);
    let x = random_vec(rng, cols as usize, 1.0);
    let e = |e: emberlm::Error| e.to_string();
    let wb = ctx.storage_from("w", &w).map_err(e)?;
    let xb = ctx.storage_from("x", &x).map_err(e)?;
    let mut runs = Vec::new();
    for _ in 0..3 {
        let yb = ctx.storage_zeroed("y", u64::from(rows) * 4).map_err(e)?;
        let binding = op.bind(ctx, &wb, &xb, None, &yb, rows, cols).map_err(e)?;
        ctx.submit_pass("determinism", |pass| binding.record(pass, 1));
        let got = ctx.read_f32(&yb, rows as usize).await.map_err(e)?;
        runs.push(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }
    if runs.windows(2).all(|p| p[0] == p[1]) {
        Ok(())
    } else {
        Err(format!(
            "matvec {reduction:?}: repeated runs differ in their bits"
        ))
    }
}
