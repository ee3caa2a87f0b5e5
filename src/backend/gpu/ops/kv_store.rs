//! The KV-cache write as a dispatch of its own (`shaders/kv_store.wgsl`), for the producers
//! that cannot encode the cache themselves: after the step's keys are rotated (by the stacked
//! Q/K/V projection, or by [`super::RopeKvWrite::rotate_only`] for separate projections), one
//! dispatch per layer encodes the step's K and V rows into the caches in their kinds
//! ([`KvKinds`]; f16, q8_0, q4_0 and nf4 quantize on the way in).
//!
//! The stacked projection writes f32 and f16 caches itself, and caches of block kinds too when
//! its query and key/value rows come in whole 32-value blocks
//! ([`super::LinearOptions::kv_blocks`]): a block's scale depends on all 32 of its values, so
//! only a workgroup that computes whole blocks can encode one. Separate projections (rotated by
//! the RoPE kernel) and row counts that split blocks take this dispatch, one small one per
//! layer. Both encoders share `shaders/lib/kv_encode.wgsl`.

use crate::backend::gpu::host_struct::host_struct;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{
    check_distinct, check_len, check_max_tokens, check_step, dispatch_grid, elements, load,
    positive, wg_size, Grid, KernelBinding,
};
use crate::backend::gpu::device::GpuContext;
use crate::backend::gpu::kernels::{self, Defines, KernelCache};
use crate::dtype::kv::{KvKinds, KV_BLOCK};
use crate::error::{Error, Result};

host_struct! {
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Pod, Zeroable)]
    pub(crate) struct KvStoreParams {
        kv_dim: u32,
        max_positions: u32,
        k_off: u32,
        k_stride: u32,
        v_off: u32,
        v_stride: u32,
        ring: u32,
        _pad: u32,
    }
}

/// Where the step's K and V rows are read: token `t`'s value `c` of K is
/// `k[t · k_stride + k_off + c]` (V likewise). For a stacked `q | k | v` projection both are its
/// output buffer, with `k_off = q_dim`, `v_off = q_dim + kv_dim` and strides
/// `q_dim + 2·kv_dim`.
#[derive(Debug, Clone, Copy)]
pub struct KvSource<'a> {
    /// The buffer holding the keys, f32.
    pub k: &'a wgpu::Buffer,
    /// First column of the keys within a token's row.
    pub k_off: u32,
    /// Values between consecutive tokens' rows of `k`.
    pub k_stride: u32,
    /// The buffer holding the values, f32 (may be `k`).
    pub v: &'a wgpu::Buffer,
    /// First column of the values.
    pub v_off: u32,
    /// Values between consecutive tokens' rows of `v`.
    pub v_stride: u32,
}

/// Encodes the step's tokens `t < n_tokens` into cache rows `p = pos0 + t`:
/// `k_cache[p] = encode_k(k[t])`, `v_cache[p] = encode_v(v[t])`, with
/// `k_cache: [max_positions, kinds.k.row_words(kv_dim)]` u32 and `v_cache` likewise.
#[derive(Debug, Clone)]
pub struct KvStore {
    pipeline: Arc<wgpu::ComputePipeline>,
    kinds: KvKinds,
    wg_size: u32,
}

impl KvStore {
    /// Builds (or fetches from `cache`) the kernel for the caches' kinds.
    pub async fn new(ctx: &GpuContext, cache: &KernelCache, kinds: KvKinds) -> Result<Self> {
        let wg_size = wg_size(ctx).min(64);
        let defines = Defines::new()
            .value("WG_SIZE", format!("{wg_size}u"))
            .value("K_KIND", format!("{}u", kinds.k.code()))
            .value("V_KIND", format!("{}u", kinds.v.code()));
        let pipeline = load(ctx, cache, &kernels::KV_STORE, "kv_store", defines).await?;
        Ok(Self {
            pipeline,
            kinds,
            wg_size,
        })
    }

    /// The kinds it writes.
    pub fn kinds(&self) -> KvKinds {
        self.kinds
    }

    /// Binds the step's rows `src` (`kv_dim` values per token and cache, for steps of at most
    /// `max_tokens` tokens) and one layer's caches of `max_positions` rows with the
    /// [`super::StepParams`] uniform `step`. Checks the sizes and that the caches are distinct
    /// from each other and from the sources.
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        src: KvSource<'_>,
        k_cache: &wgpu::Buffer,
        v_cache: &wgpu::Buffer,
        kv_dim: u32,
        max_positions: u32,
        max_tokens: u32,
    ) -> Result<KernelBinding> {
        self.bind_in_ring(
            ctx,
            step,
            src,
            (k_cache, v_cache),
            kv_dim,
            (max_positions, None),
            max_tokens,
        )
    }

    /// [`KvStore::bind`] for caches that keep a sequence's `max_positions` positions in a ring
    /// of `ring` rows per sequence where given (position `p` in row `slot · ring + p mod ring`).
    #[allow(clippy::too_many_arguments)]
    pub fn bind_in_ring(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        src: KvSource<'_>,
        (k_cache, v_cache): (&wgpu::Buffer, &wgpu::Buffer),
        kv_dim: u32,
        (max_positions, ring): (u32, Option<u32>),
        max_tokens: u32,
    ) -> Result<KernelBinding> {
        check_step(step)?;
        check_max_tokens(ctx, max_tokens)?;
        positive("max_positions", max_positions)?;
        if let Some(ring) = ring {
            positive("ring", ring)?;
        }
        positive("kv_dim", kv_dim)?;
        for (name, off, stride) in [
            ("k_stride", src.k_off, src.k_stride),
            ("v_stride", src.v_off, src.v_stride),
        ] {
            if u64::from(off) + u64::from(kv_dim) > u64::from(stride) {
                return Err(Error::invalid(
                    name,
                    format!(
                        "a row of {kv_dim} values from column {off} does not fit rows of {stride}"
                    ),
                ));
            }
        }
        check_len(
            "k",
            src.k,
            elements("max_tokens", max_tokens, u64::from(src.k_stride))?,
        )?;
        check_len(
            "v",
            src.v,
            elements("max_tokens", max_tokens, u64::from(src.v_stride))?,
        )?;
        let dim = kv_dim as usize;
        for (name, buffer, kind) in [
            ("k_cache", k_cache, self.kinds.k),
            ("v_cache", v_cache, self.kinds.v),
        ] {
            let rows = ring.unwrap_or(max_positions);
            let words = elements("cache rows", rows, kind.row_words(dim) as u64)?;
            check_len(name, buffer, words)?;
            check_distinct(name, buffer, "k", src.k)?;
            check_distinct(name, buffer, "v", src.v)?;
        }
        check_distinct("k_cache", k_cache, "v_cache", v_cache)?;
        let pairs = dim.div_ceil(KV_BLOCK).div_ceil(2) as u32;
        let (x, y) = dispatch_grid(ctx, "kv_store", (2 * pairs).div_ceil(self.wg_size))?;
        if y != 1 {
            return Err(Error::invalid(
                "kv_dim",
                format!("{kv_dim} values per row need more workgroups than one dispatch row"),
            ));
        }
        let params = KvStoreParams {
            kv_dim,
            max_positions,
            k_off: src.k_off,
            k_stride: src.k_stride,
            v_off: src.v_off,
            v_stride: src.v_stride,
            ring: ring.unwrap_or(0),
            _pad: 0,
        };
        Ok(KernelBinding::new(
            ctx,
            &self.pipeline,
            "kv_store",
            &params,
            Some(step),
            &[src.k, src.v, k_cache, v_cache],
            Grid::PerToken(x),
        ))
    }
}
