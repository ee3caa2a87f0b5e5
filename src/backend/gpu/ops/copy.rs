//! A buffer copy kernel (`shaders/copy.wgsl`) that measures the adapter's memory bandwidth:
//! decode is memory-bound, so its speed is reported as a fraction of this figure.

use crate::backend::gpu::host_struct::host_struct;
use bytemuck::{Pod, Zeroable};

use super::{dispatch_grid, load, wg_size, Grid, KernelBinding};
use crate::backend::gpu::device::GpuContext;
use crate::backend::gpu::kernels::{self, Defines, KernelCache};
use crate::error::Result;

host_struct! {
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Pod, Zeroable)]
    pub(crate) struct CopyParams {
        n: u32,
        row: u32,
        _pad: [u32; 2],
    }
}

/// One bandwidth measurement.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct CopyBandwidth {
    /// Bytes of the source buffer (the destination is as large).
    pub buffer_bytes: u64,
    /// Copies timed, all in one pass.
    pub copies: u32,
    /// Seconds for them, including one submit and one small readback.
    pub seconds: f64,
    /// `2 · buffer_bytes · copies / seconds`: bytes read plus bytes written per second.
    pub bytes_per_s: f64,
}

/// Copies a buffer of about `bytes` bytes (capped by the device's binding limit) `copies` times
/// in one compute pass after one untimed warm-up copy, and returns the bandwidth.
pub async fn copy_bandwidth(
    ctx: &GpuContext,
    cache: &KernelCache,
    bytes: u64,
    copies: u32,
) -> Result<CopyBandwidth> {
    let wg = wg_size(ctx);
    let defines = Defines::new().value("WG_SIZE", format!("{wg}u"));
    let pipeline = load(ctx, cache, &kernels::COPY, "copy_vec4", defines).await?;
    let cap = ctx
        .limits()
        .max_storage_buffer_binding_size
        .min(ctx.limits().max_buffer_size);
    let bytes = (bytes.min(cap) / 16).max(1) * 16;
    let n = u32::try_from(bytes / 16).unwrap_or(u32::MAX);
    let bytes = u64::from(n) * 16;
    let src = ctx.storage_zeroed("copy src", bytes)?;
    let dst = ctx.storage_zeroed("copy dst", bytes)?;
    let (x, y) = dispatch_grid(ctx, "copy_vec4", n.div_ceil(wg))?;
    let params = CopyParams {
        n,
        row: x * wg,
        _pad: [0; 2],
    };
    let binding = KernelBinding::new(
        ctx,
        &pipeline,
        "copy",
        &params,
        None,
        &[&src, &dst],
        Grid::Fixed(x, y),
    );
    ctx.submit_pass("copy warm-up", |pass| binding.record(pass, 1));
    ctx.read_bytes(&dst, 4).await?;
    let copies = copies.max(1);
    let start = web_time::Instant::now();
    ctx.submit_pass("copy bandwidth", |pass| {
        for _ in 0..copies {
            binding.record(pass, 1);
        }
    });
    ctx.read_bytes(&dst, 4).await?;
    let seconds = start.elapsed().as_secs_f64().max(1e-9);
    Ok(CopyBandwidth {
        buffer_bytes: bytes,
        copies,
        seconds,
        bytes_per_s: 2.0 * bytes as f64 * f64::from(copies) / seconds,
    })
}
