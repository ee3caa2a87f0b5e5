//! The argument checks every kernel's binding shares: buffer sizes, distinct writable
//! buffers, the step uniform, token and element counts, and the f16-activation precondition.
//! Each error names the argument.

use super::GpuContext;
use crate::error::{Error, Result};

/// Refuses f16 activations (an option named `name`) unless the products run in f16, the only
/// precision whose kernels enable f16 and whose adapters have `shader-f16`.
pub(crate) fn check_f16_activations(ctx: &GpuContext, name: &'static str) -> Result<()> {
    if ctx.precision() == crate::backend::gpu::precision::MatmulPrecision::F16 {
        return Ok(());
    }
    Err(Error::invalid(name, "f16 activations need precision f16"))
}

/// Fails unless `buffer` holds at least `elements` f32 values.
pub(crate) fn check_len(name: &'static str, buffer: &wgpu::Buffer, elements: u64) -> Result<()> {
    let needed = elements * 4;
    if buffer.size() < needed {
        return Err(Error::invalid(
            name,
            format!(
                "buffer holds {} bytes but the shape needs {needed} ({elements} f32)",
                buffer.size()
            ),
        ));
    }
    Ok(())
}

/// An optional input of a kernel built with or without it: `given` must be present exactly
/// when `built` (`what` names it in the message: "bias", "a norm", ...).
pub(crate) fn optional_input<T>(
    name: &'static str,
    what: &str,
    built: bool,
    given: Option<T>,
) -> Result<Option<T>> {
    match (built, given) {
        (true, None) => Err(Error::invalid(
            name,
            format!("kernel built with {what}, none given"),
        )),
        (false, Some(_)) => Err(Error::invalid(
            name,
            format!("kernel built without {what}, one given"),
        )),
        (_, given) => Ok(given),
    }
}

pub(crate) fn positive(name: &'static str, value: u32) -> Result<()> {
    if value == 0 {
        return Err(Error::invalid(name, "must be at least 1"));
    }
    Ok(())
}

/// Fails unless `step` can be bound as the [`super::StepParams`] uniform: bound as a uniform, and
/// large enough to hold the step parameters. Every token-dependent kernel checks its step
/// buffer with this.
pub(crate) fn check_step(step: &wgpu::Buffer) -> Result<()> {
    let needed = super::STEP_UNIFORM_BYTES;
    if !step.usage().contains(wgpu::BufferUsages::UNIFORM) {
        return Err(Error::invalid(
            "step",
            format!(
                "must be a uniform buffer (see StepParams::create_buffer), got usage {:?}",
                step.usage()
            ),
        ));
    }
    if step.size() < needed {
        return Err(Error::invalid(
            "step",
            format!(
                "buffer holds {} bytes but the step parameters take {needed}",
                step.size()
            ),
        ));
    }
    Ok(())
}

/// Fails when `written` (bound writable) is the same buffer as `other`: WebGPU forbids a
/// buffer bound writable and bound again in the same dispatch.
pub(crate) fn check_distinct(
    written_name: &'static str,
    written: &wgpu::Buffer,
    other_name: &str,
    other: &wgpu::Buffer,
) -> Result<()> {
    if written == other {
        return Err(Error::invalid(
            written_name,
            format!("must be a different buffer from `{other_name}`"),
        ));
    }
    Ok(())
}

/// Checks `max_tokens` (rows of the activation buffers) against the dispatch limit, since
/// token-dependent grids put one workgroup row per token.
pub(crate) fn check_max_tokens(ctx: &GpuContext, max_tokens: u32) -> Result<()> {
    positive("max_tokens", max_tokens)?;
    let max = ctx.limits().max_compute_workgroups_per_dimension;
    if max_tokens > max {
        return Err(Error::Limit {
            what: "max_tokens (one workgroup row per token)".to_string(),
            limit: "maxComputeWorkgroupsPerDimension",
            needed: u64::from(max_tokens),
            allowed: u64::from(max),
        });
    }
    Ok(())
}

/// Elements of a `[rows, width]` activation as u64, failing when it cannot be indexed with u32.
pub(crate) fn elements(name: &'static str, rows: u32, width: u64) -> Result<u64> {
    let total = u64::from(rows) * width;
    if total > u64::from(u32::MAX) {
        return Err(Error::invalid(
            name,
            format!("{rows} rows of {width} values overflow u32 indexing"),
        ));
    }
    Ok(total)
}
