//! Rotary position embedding fused with the KV-cache write (`shaders/rope.wgsl`): one dispatch
//! per layer rotates the step's queries in place and its keys on their way into the cache,
//! and copies its values into the cache. The no-RoPE form (GPT-2) is the same kernel without
//! the rotation.
//!
//! The angle `p · theta^(−2i/head_dim)` is not formed in f32 (whose rounding alone is
//! 2.4e-4 rad at position 4096 and grows with the position): the host passes each frequency
//! as turns per position in 0.64 fixed point, the kernel reduces `p · freq` modulo one turn
//! exactly in integer arithmetic and evaluates sin/cos with its own polynomial. The angle is
//! within about 1e-7 rad of the f64 one at every position, on every GPU.

use crate::backend::gpu::host_struct::host_struct;
use std::f64::consts::TAU;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{
    check_distinct, check_len, check_max_tokens, check_step, dispatch_grid, elements, load,
    positive, wg_size, Grid, Heads, KernelBinding, MAX_HEAD_DIM,
};
use crate::backend::gpu::device::GpuContext;
use crate::backend::gpu::kernels::{self, Defines, KernelCache};
use crate::config::{RopeFreqs, RopeLayout};
use crate::error::{Error, Result};

/// `vec4<u32>`s in the frequency table: two (hi, lo) pairs each, one pair per rotated pair.
pub(crate) const FREQ_VEC4S: usize = MAX_HEAD_DIM as usize / 4;

host_struct! {
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Pod, Zeroable)]
    pub(crate) struct RopeParams {
        n_heads: u32,
        n_kv_heads: u32,
        head_dim: u32,
        max_positions: u32,
        q_stride: u32,
        k_off: u32,
        k_stride: u32,
        v_off: u32,
        v_stride: u32,
        ring: u32,
        _pad: [u32; 2],
        freqs: [[u32; 4]; FREQ_VEC4S],
    }
}

/// Each rotated pair's frequency (`theta^(−2i/head_dim)`, scaled as `rope` says) as turns
/// per position, `freq / 2π` in 0.64 fixed point split into (high, low) 32-bit words,
/// computed in f64 like the CPU reference. The callers check `freq / 2π < 1`, so the integer
/// part is always 0.
fn freq_table(rope: &RopeFreqs, head_dim: u32) -> [[u32; 4]; FREQ_VEC4S] {
    let mut table = [[0u32; 4]; FREQ_VEC4S];
    for i in 0..(head_dim / 2) as usize {
        let freq = rope.frequency(i, head_dim as usize);
        let fixed = (freq / TAU * 2f64.powi(64)).round() as u64;
        table[i / 2][2 * (i % 2)] = (fixed >> 32) as u32;
        table[i / 2][2 * (i % 2) + 1] = fixed as u32;
    }
    table
}

/// [`freq_table`] as one `[hi, lo]` pair per rotated pair `i < head_dim / 2` (the fused
/// Q/K/V linear's table).
pub(crate) fn freq_pairs(rope: &RopeFreqs, head_dim: u32) -> Vec<[u32; 2]> {
    let table = freq_table(rope, head_dim);
    (0..(head_dim / 2) as usize)
        .map(|i| [table[i / 2][2 * (i % 2)], table[i / 2][2 * (i % 2) + 1]])
        .collect()
}

/// Checks a RoPE for heads of `head_dim`: theta finite and ≥ 1 (below 1 frequencies exceed a
/// radian per position: no model does it), the scaling's parameters, and every frequency
/// under a turn per position (the fixed-point table holds fractions of a turn).
pub(crate) fn check_freqs(rope: &RopeFreqs, head_dim: u32) -> Result<()> {
    let theta = rope.theta;
    if !(theta.is_finite() && theta >= 1.0) {
        return Err(Error::invalid(
            "theta",
            format!("must be finite and >= 1, got {theta}"),
        ));
    }
    rope.scaling.check(head_dim as usize)?;
    if let Some(f) = rope
        .frequencies(head_dim as usize)
        .into_iter()
        .find(|f| !(*f >= 0.0 && *f < TAU))
    {
        return Err(Error::invalid(
            "rope_scaling",
            format!("a frequency of {f} rad per position is out of range"),
        ));
    }
    Ok(())
}

/// The buffers holding the step's q, k and v (separate projections; a stacked `q | k | v`
/// projection rotates and writes the cache in its own epilogue):
/// `q: [max_tokens, n_heads·hd]`, `k, v: [max_tokens, n_kv_heads·hd]`. Without RoPE, `q` is
/// not touched (nor bound).
#[derive(Debug, Clone, Copy)]
pub struct Qkv<'a> {
    /// Queries, rotated in place.
    pub q: &'a wgpu::Buffer,
    /// Keys (read).
    pub k: &'a wgpu::Buffer,
    /// Values (read).
    pub v: &'a wgpu::Buffer,
}

/// RoPE on q and k plus the KV-cache write, for the step's tokens `t < n_tokens` at
/// positions `p = pos0 + t`: `q[t]` rotated in place, `k_cache[p] = rope(k[t])`,
/// `v_cache[p] = v[t]`. `k_cache, v_cache: [max_positions, n_kv_heads·hd]` (one layer's).
///
/// Pair `i` of each head is rotated by `p · theta^(−2i/head_dim)`; it holds dimensions
/// `(2i, 2i+1)` for [`RopeLayout::Interleaved`] and `(i, i + hd/2)` for
/// [`RopeLayout::RotateHalf`]; [`RopeLayout::None`] only writes the cache.
#[derive(Debug, Clone)]
pub struct RopeKvWrite {
    pipeline: Arc<wgpu::ComputePipeline>,
    layout: RopeLayout,
    wg_size: u32,
    /// Rotation only (q and k in place; the caches are written by a [`super::KvStore`]).
    rotate_only: bool,
}

impl RopeKvWrite {
    /// Builds (or fetches from `cache`) the kernel for a RoPE layout.
    pub async fn new(ctx: &GpuContext, cache: &KernelCache, layout: RopeLayout) -> Result<Self> {
        let wg_size = wg_size(ctx);
        let defines = Defines::new()
            .value("WG_SIZE", format!("{wg_size}u"))
            .value("FREQ_VEC4S", FREQ_VEC4S)
            .flag_if("ROTATE_HALF", layout == RopeLayout::RotateHalf)
            .flag_if("NO_ROPE", layout == RopeLayout::None);
        let pipeline = load(ctx, cache, &kernels::ROPE, "rope_kv_write", defines).await?;
        Ok(Self {
            pipeline,
            layout,
            wg_size,
            rotate_only: false,
        })
    }

    /// The kernel that only rotates, for caches of other kinds than f32: `q[t]` and `k[t]` are
    /// rotated in place and a [`super::KvStore`] encodes k and v into the caches after. Bind it
    /// with [`RopeKvWrite::bind_rotate_only`]. A model without RoPE needs no such kernel.
    pub async fn rotate_only(
        ctx: &GpuContext,
        cache: &KernelCache,
        layout: RopeLayout,
    ) -> Result<Self> {
        if layout == RopeLayout::None {
            return Err(Error::invalid(
                "layout",
                "a model without RoPE has nothing to rotate",
            ));
        }
        let wg_size = wg_size(ctx);
        let defines = Defines::new()
            .value("WG_SIZE", format!("{wg_size}u"))
            .value("FREQ_VEC4S", FREQ_VEC4S)
            .flag_if("ROTATE_HALF", layout == RopeLayout::RotateHalf)
            .flag("KV_DEFER");
        let pipeline = load(ctx, cache, &kernels::ROPE, "rope_kv_write", defines).await?;
        Ok(Self {
            pipeline,
            layout,
            wg_size,
            rotate_only: true,
        })
    }

    /// Binds a [`RopeKvWrite::rotate_only`] kernel: `q: [max_tokens, n_heads·hd]` and
    /// `k: [max_tokens, n_kv_heads·hd]`, both rotated in place at positions `pos0 + t`.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_rotate_only(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        q: &wgpu::Buffer,
        k: &wgpu::Buffer,
        heads: Heads,
        rope: impl Into<RopeFreqs>,
        max_tokens: u32,
    ) -> Result<KernelBinding> {
        if !self.rotate_only {
            return Err(Error::invalid(
                "rope",
                "kernel built to write the caches; use bind",
            ));
        }
        // no cache rows to guard: every position is rotated
        let positions = u32::MAX;
        self.bind_checked(
            ctx,
            step,
            Qkv { q, k, v: k },
            None,
            heads,
            &rope.into(),
            (positions, None),
            max_tokens,
        )
    }

    /// Binds the step's `qkv` and one layer's caches (`max_positions` rows each) with the
    /// [`super::StepParams`] uniform `step`, for steps of at most `max_tokens` tokens.
    /// Checks the head geometry (`head_dim` even and at most [`MAX_HEAD_DIM`] with RoPE),
    /// `theta` (finite, ≥ 1; ignored without RoPE), the buffers' sizes and that no written
    /// buffer is bound twice.
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        qkv: Qkv<'_>,
        k_cache: &wgpu::Buffer,
        v_cache: &wgpu::Buffer,
        heads: Heads,
        rope: impl Into<RopeFreqs>,
        max_positions: u32,
        max_tokens: u32,
    ) -> Result<KernelBinding> {
        self.bind_in_ring(
            ctx,
            step,
            qkv,
            (k_cache, v_cache),
            heads,
            rope,
            (max_positions, None),
            max_tokens,
        )
    }

    /// [`RopeKvWrite::bind`] for caches that keep a sequence's `max_positions` positions in a
    /// ring of `ring` rows per sequence where given (position `p` in row
    /// `slot · ring + p mod ring`).
    #[allow(clippy::too_many_arguments)]
    pub fn bind_in_ring(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        qkv: Qkv<'_>,
        (k_cache, v_cache): (&wgpu::Buffer, &wgpu::Buffer),
        heads: Heads,
        rope: impl Into<RopeFreqs>,
        positions: (u32, Option<u32>),
        max_tokens: u32,
    ) -> Result<KernelBinding> {
        if self.rotate_only {
            return Err(Error::invalid(
                "rope",
                "kernel built to rotate only; use bind_rotate_only",
            ));
        }
        self.bind_checked(
            ctx,
            step,
            qkv,
            Some((k_cache, v_cache)),
            heads,
            &rope.into(),
            positions,
            max_tokens,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn bind_checked(
        &self,
        ctx: &GpuContext,
        step: &wgpu::Buffer,
        qkv: Qkv<'_>,
        caches: Option<(&wgpu::Buffer, &wgpu::Buffer)>,
        heads: Heads,
        freqs: &RopeFreqs,
        (max_positions, ring): (u32, Option<u32>),
        max_tokens: u32,
    ) -> Result<KernelBinding> {
        check_step(step)?;
        check_max_tokens(ctx, max_tokens)?;
        positive("max_positions", max_positions)?;
        if let Some(ring) = ring {
            positive("ring", ring)?;
        }
        let rope = self.layout != RopeLayout::None;
        heads.check(if rope { MAX_HEAD_DIM } else { u32::MAX })?;
        if rope && !heads.head_dim.is_multiple_of(2) {
            return Err(Error::invalid(
                "head_dim",
                format!("must be even for RoPE, got {}", heads.head_dim),
            ));
        }
        if rope {
            check_freqs(freqs, heads.head_dim)?;
        }
        let (q_dim, kv_dim) = (heads.q_dim(), heads.kv_dim());
        let mut storage: Vec<&wgpu::Buffer> = Vec::with_capacity(5);
        let Qkv { q, k, v } = qkv;
        let len = |w| elements("max_tokens", max_tokens, w);
        if rope {
            check_len("q", q, len(q_dim)?)?;
            storage.push(q);
        }
        check_len("k", k, len(kv_dim)?)?;
        storage.push(k);
        if rope {
            check_distinct("q", q, "k", k)?;
        }
        if let Some((k_cache, v_cache)) = caches {
            let cache_len = elements("cache rows", ring.unwrap_or(max_positions), kv_dim)?;
            check_len("k_cache", k_cache, cache_len)?;
            check_len("v_cache", v_cache, cache_len)?;
            check_distinct("k_cache", k_cache, "v_cache", v_cache)?;
            check_len("v", v, len(kv_dim)?)?;
            storage.push(v);
            for (name, written) in [("k_cache", k_cache), ("v_cache", v_cache)] {
                for &other in &storage {
                    check_distinct(name, written, "q/k/v", other)?;
                }
            }
            if rope {
                check_distinct("q", q, "v", v)?;
            }
            storage.extend([k_cache, v_cache]);
        }
        let (q_stride, k_off, k_stride, v_off, v_stride) = (q_dim, 0, kv_dim, 0, kv_dim);

        let items = if self.rotate_only {
            (heads.n_heads + heads.n_kv_heads) * (heads.head_dim / 2)
        } else if rope {
            (heads.n_heads + heads.n_kv_heads) * (heads.head_dim / 2)
                + heads.n_kv_heads * heads.head_dim
        } else {
            2 * heads.n_kv_heads * heads.head_dim
        };
        let groups = items.div_ceil(self.wg_size);
        // one row of workgroups per token: the x extent must fit in one dimension
        let (x, y) = dispatch_grid(ctx, "rope_kv_write", groups)?;
        if y != 1 {
            return Err(Error::invalid(
                "heads",
                format!("{items} values per token need more workgroups than one dispatch row"),
            ));
        }
        let to_u32 = |v: u64| v as u32; // widths were checked against u32 by `heads.check`
        let params = RopeParams {
            n_heads: heads.n_heads,
            n_kv_heads: heads.n_kv_heads,
            head_dim: heads.head_dim,
            max_positions,
            q_stride: to_u32(q_stride),
            k_off: to_u32(k_off),
            k_stride: to_u32(k_stride),
            v_off: to_u32(v_off),
            v_stride: to_u32(v_stride),
            ring: ring.unwrap_or(0),
            _pad: [0; 2],
            freqs: if rope {
                freq_table(freqs, heads.head_dim)
            } else {
                [[0; 4]; FREQ_VEC4S]
            },
        };
        Ok(KernelBinding::new(
            ctx,
            &self.pipeline,
            "rope_kv_write",
            &params,
            Some(step),
            &storage,
            Grid::PerToken(x),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's angle arithmetic, replayed on the CPU: the fraction of a turn at `pos`.
    fn turns(table: &[[u32; 4]; FREQ_VEC4S], i: usize, pos: u32) -> f64 {
        let (hi, lo) = (table[i / 2][2 * (i % 2)], table[i / 2][2 * (i % 2) + 1]);
        let mul_hi = ((u64::from(pos) * u64::from(lo)) >> 32) as u32;
        let turn = pos.wrapping_mul(hi).wrapping_add(mul_hi);
        f64::from(turn) / 2f64.powi(32)
    }

    #[test]
    fn fixed_point_angles_match_f64_at_any_position() {
        let (theta, hd) = (10000.0f32, 64u32);
        let table = freq_table(&theta.into(), hd);
        for pos in [0u32, 1, 7, 4095, 65_537, 1 << 20, u32::MAX] {
            for i in 0..(hd / 2) as usize {
                let freq = f64::from(theta).powf(-2.0 * i as f64 / f64::from(hd));
                let want = (f64::from(pos) * freq / TAU).rem_euclid(1.0);
                let mut diff = (turns(&table, i, pos) - want).abs();
                diff = diff.min(1.0 - diff);
                // 2^-32 turn of truncation plus the f64 rounding of freq times pos
                let tol = 2f64.powi(-31) + f64::from(pos) * 2f64.powi(-55);
                assert!(diff <= tol, "pos {pos} pair {i}: {diff:e} turns");
            }
        }
    }
}
