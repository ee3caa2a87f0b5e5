//! The elementwise SwiGLU gate over the step's tokens (`shaders/elementwise.wgsl`), for layers
//! whose gate and up projections are not fused into one linear. One invocation per value.

use crate::backend::gpu::host_struct::host_struct;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{
    check_distinct, check_f16_activations, check_len, check_max_tokens, check_step, dispatch_grid,
    elements, load, positive, wg_size, Grid, KernelBinding,
};
use crate::backend::gpu::device::GpuContext;
use crate::backend::gpu::kernels::{self, Defines, KernelCache};
use crate::error::{Error, Result};

host_struct! {
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Pod, Zeroable)]
    pub(crate) struct ElementwiseParams {
        n: u32,
        in_stride: u32,
        in_off0: u32,
        in_off1: u32,
    }
}

/// One elementwise entry point of `elementwise.wgsl`.
#[derive(Debug, Clone)]
struct Elementwise {
    pipeline: Arc<wgpu::ComputePipeline>,
    entry: &'static str,
    wg_size: u32,
    /// Whether the output holds f16 (two values per word).
    out_f16: bool,
}

impl Elementwise {
    async fn new(
        ctx: &GpuContext,
        cache: &KernelCache,
        entry: &'static str,
        gelu_gate: bool,
        out_f16: bool,
    ) -> Result<Self> {
        if out_f16 {
            check_f16_activations(ctx, "out_f16")?;
        }
        let wg_size = wg_size(ctx);
        let defines = Defines::new()
            .value("WG_SIZE", format!("{wg_size}u"))
            .flag_if("GELU_GATE", gelu_gate)
            .flag_if("OUT_F16", out_f16);
        let pipeline = load(ctx, cache, &kernels::ELEMENTWISE, entry, defines).await?;
        Ok(Self {
            pipeline,
            entry,
            wg_size,
            out_f16,
        })
    }

    /// Checks that `out` holds `total` output values (half a word each when f16).
    fn check_out(&self, out: &wgpu::Buffer, total: u64) -> Result<()> {
        check_len(
            "out",
            out,
            match self.out_f16 {
                true => total.div_ceil(2),
                false => total,
            },
        )
    }

    /// Common checks, then the binding over rows of `n` values.
    fn bind(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        params: ElementwiseParams,
        storage: &[&wgpu::Buffer],
    ) -> Result<KernelBinding> {
        let (x, y) = dispatch_grid(ctx, self.entry, params.n.div_ceil(self.wg_size))?;
        if y != 1 {
            return Err(Error::invalid(
                "n",
                format!("{} values per token exceed one dispatch row", params.n),
            ));
        }
        Ok(KernelBinding::new(
            ctx,
            &self.pipeline,
            self.entry,
            &params,
            Some(step),
            storage,
            Grid::PerToken(x),
        ))
    }
}

fn common(ctx: &GpuContext, step: &wgpu::Buffer, n: u32, max_tokens: u32) -> Result<u64> {
    check_step(step)?;
    check_max_tokens(ctx, max_tokens)?;
    positive("n", n)?;
    elements("n", max_tokens, u64::from(n))
}

/// SwiGLU gate for the step's tokens: `out[t, i] = silu(gate[t, i]) · up[t, i]`,
/// `silu(x) = x·sigmoid(x)`. `out: [max_tokens, ff]`; gate and up are either two
/// `[max_tokens, ff]` buffers ([`Self::bind`]) or one fused `[max_tokens, 2·ff]` buffer whose
/// rows are `gate | up` ([`Self::bind_fused`]: one matrix product for both projections).
#[derive(Debug, Clone)]
pub struct SwiGlu(Elementwise);

impl SwiGlu {
    /// Builds (or fetches from `cache`) the kernel.
    pub async fn new(ctx: &GpuContext, cache: &KernelCache) -> Result<Self> {
        Self::with_output(ctx, cache, false, false).await
    }

    /// The GeGLU gate instead (Gemma): `out[t, i] = gelu_tanh(gate[t, i]) · up[t, i]`, bound
    /// the same way.
    pub async fn geglu(ctx: &GpuContext, cache: &KernelCache) -> Result<Self> {
        Self::with_output(ctx, cache, true, false).await
    }

    /// SwiGLU, or GeGLU with `gelu_gate`, writing `out` as f16 with `out_f16` (two values
    /// per word, for a down projection that reads f16; needs
    /// [`MatmulPrecision::F16`]).
    pub async fn with_output(
        ctx: &GpuContext,
        cache: &KernelCache,
        gelu_gate: bool,
        out_f16: bool,
    ) -> Result<Self> {
        Ok(Self(
            Elementwise::new(ctx, cache, "swiglu", gelu_gate, out_f16).await?,
        ))
    }

    /// Binds `gate, up, out: [max_tokens, ff]` with the [`super::StepParams`] uniform `step`.
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        gate: &wgpu::Buffer,
        up: &wgpu::Buffer,
        out: &wgpu::Buffer,
        ff: u32,
        max_tokens: u32,
    ) -> Result<KernelBinding> {
        let total = common(ctx, step, ff, max_tokens)?;
        check_len("gate", gate, total)?;
        check_len("up", up, total)?;
        self.0.check_out(out, total)?;
        check_distinct("out", out, "gate", gate)?;
        check_distinct("out", out, "up", up)?;
        let params = ElementwiseParams {
            n: ff,
            in_stride: ff,
            in_off0: 0,
            in_off1: 0,
        };
        self.0.bind(ctx, step, params, &[out, gate, up])
    }

    /// Binds `gate_up: [max_tokens, 2·ff]` (rows `gate | up`) and `out: [max_tokens, ff]`
    /// with the [`super::StepParams`] uniform `step`.
    pub fn bind_fused(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        gate_up: &wgpu::Buffer,
        out: &wgpu::Buffer,
        ff: u32,
        max_tokens: u32,
    ) -> Result<KernelBinding> {
        let total = common(ctx, step, ff, max_tokens)?;
        let stride = u64::from(ff) * 2;
        check_len("gate_up", gate_up, elements("ff", max_tokens, stride)?)?;
        self.0.check_out(out, total)?;
        check_distinct("out", out, "gate_up", gate_up)?;
        let params = ElementwiseParams {
            n: ff,
            in_stride: 2 * ff,
            in_off0: 0,
            in_off1: ff,
        };
        // read-only twice in one bind group is allowed: only writable bindings may not alias
        self.0.bind(ctx, step, params, &[out, gate_up, gate_up])
    }
}
