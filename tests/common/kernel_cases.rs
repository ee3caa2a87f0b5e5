//! Cases shared by the kernel tests, run natively on lavapipe and in the browser on WebGPU:
//! the reductions a device offers, and the determinism of the reducing kernels.

use emberlm::backend::gpu::ops::{Linear, LinearKernel};
use emberlm::backend::gpu::{GpuContext, KernelCache, Reduction, StepParams};
use emberlm::dtype::DType;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::linear_cases::{step_buffer, upload_matrix};

/// Both reductions where the device has subgroups, the workgroup tree otherwise.
pub fn reductions(ctx: &GpuContext) -> Vec<Reduction> {
    let mut r = vec![Reduction::Workgroup];
    if ctx.has_subgroups() {
        r.push(Reduction::Subgroup);
    }
    r
}

/// The decode linear (the kernel that reduces across its workgroup, and through subgroups when
/// asked) orders its partials, so repeated runs give identical bits. `W: [61, 2053]` f32,
/// one token.
pub async fn check_linear_deterministic(
    ctx: &GpuContext,
    cache: &KernelCache,
    reduction: Reduction,
    rng: &mut ChaCha8Rng,
) -> Result<(), String> {
    let (rows, cols) = (61usize, 2053usize);
    let e = |e: emberlm::Error| e.to_string();
    let op = Linear::new(ctx, cache, DType::F32, reduction, false, false)
        .await
        .map_err(e)?;
    let (w, _) = upload_matrix(ctx, rng, DType::F32, rows, cols)?;
    let x: Vec<f32> = (0..cols).map(|_| rng.random_range(-1.0..1.0)).collect();
    let xb = ctx.storage_from("x", &x).map_err(e)?;
    let step = step_buffer(ctx);
    StepParams::new(0, 1).write(ctx, &step);
    let mut runs = Vec::new();
    for _ in 0..3 {
        let yb = ctx.storage_zeroed("y", rows as u64 * 4).map_err(e)?;
        let binding = op.bind(ctx, &step, &w, &xb, None, &yb, 1).map_err(e)?;
        ctx.submit_pass("determinism", |pass| {
            binding.record_kernel(pass, 1, LinearKernel::Decode)
        });
        let got = ctx.read_f32(&yb, rows).await.map_err(e)?;
        runs.push(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }
    if runs.windows(2).all(|p| p[0] == p[1]) {
        Ok(())
    } else {
        Err(format!(
            "linear decode {reduction:?}: repeated runs differ in their bits"
        ))
    }
}
