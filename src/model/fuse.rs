//! Weights rearranged at load so that the graph needs fewer dispatches: a Llama layer's Q, K
//! and V matrices stacked into one `[q_dim + 2·kv_dim, d]` matrix (one linear instead of
//! three), and its gate and up matrices interleaved row by row into one `[2·ffn, d]` matrix
//! whose linear applies SwiGLU in its epilogue (one dispatch instead of three).
//!
//! Rows are moved as stored bytes, so every weight type works unchanged (a row is a whole
//! number of blocks). Layers whose matrices differ in type or width keep the separate form.
//!
//! The stacked Q/K/V layer rotates its own output (RoPE in its epilogue), which needs the two
//! values of a rotated pair in adjacent rows `(2i, 2i+1)` of a head. Models whose RoPE pairs
//! `(i, i + head_dim/2)` (Hugging Face Llama) get their Q and K rows permuted into that order
//! here, as llama.cpp's converter does for GGUF files: q·k is unchanged because both sides are
//! permuted alike, and V is not touched.

use std::borrow::Cow;

use crate::config::RopeLayout;
use crate::dtype::{dequantize, DType};
use crate::error::{Error, Result};
use crate::model::graph::{gate_up_name, qkv_name};
use crate::model::weights::{ModelWeights, Tensor};

/// What [`plan`] fuses in each layer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FusionPlan {
    /// Layers whose Q, K and V are stacked (`attn_qkv`).
    pub qkv: Vec<bool>,
    /// Layers whose gate and up are interleaved (`ffn_gate_up`).
    pub gate_up: Vec<bool>,
}

impl FusionPlan {
    /// Whether some layer keeps separate Q, K, V (so their activation buffers are needed).
    pub fn any_separate_qkv(&self) -> bool {
        self.qkv.iter().any(|f| !f)
    }

    /// Whether some layer keeps separate gate and up.
    pub fn any_separate_gate_up(&self) -> bool {
        self.gate_up.iter().any(|f| !f)
    }

    /// Tensors of the file that the fused ones replace (not uploaded themselves).
    pub fn replaced(&self, name: &str) -> bool {
        let Some(rest) = name.strip_prefix("blk.") else {
            return false;
        };
        let Some((layer, part)) = rest.split_once('.') else {
            return false;
        };
        let Ok(layer) = layer.parse::<usize>() else {
            return false;
        };
        let base = part.split('.').next().unwrap_or("");
        let fused = |v: &Vec<bool>| v.get(layer).copied().unwrap_or(false);
        match base {
            "attn_q" | "attn_k" | "attn_v" => fused(&self.qkv),
            "ffn_gate" | "ffn_up" => fused(&self.gate_up),
            _ => false,
        }
    }
}

/// Same type, two dimensions, same width: rows can be stacked or interleaved.
fn compatible(parts: &[Option<&Tensor<'_>>]) -> bool {
    let mut first: Option<(DType, usize)> = None;
    for part in parts {
        let Some(t) = part else { return false };
        let &[_, cols] = t.shape.as_slice() else {
            return false;
        };
        match first {
            None => first = Some((t.dtype, cols)),
            Some(f) if f != (t.dtype, cols) => return false,
            Some(_) => {}
        }
    }
    first.is_some()
}

/// Decides, layer by layer, which matrices of `weights` can be fused: those the architecture's
/// [`Fusion`](crate::model::arch::Fusion) allows, whose parts share type and width.
pub fn plan(weights: &ModelWeights<'_>) -> FusionPlan {
    let c = &weights.config;
    let allowed = crate::model::arch::spec(c.arch).fusion;
    let mut out = FusionPlan::default();
    for layer in 0..c.n_layers {
        let get = |s: &str| weights.tensors.get(&format!("blk.{layer}.{s}.weight"));
        // QK-norm (Qwen3, Gemma 3) normalises the heads between the projection and RoPE
        out.qkv.push(
            allowed.qkv && !c.qk_norm && compatible(&[get("attn_q"), get("attn_k"), get("attn_v")]),
        );
        out.gate_up
            .push(allowed.gate_up && compatible(&[get("ffn_gate"), get("ffn_up")]));
    }
    out
}

/// The fused tensors of `layer` that `plan` asks for, as `(name, tensor)`, built from the
/// file's tensors (biases as f32, zeros where a part has none; no bias when no part has one).
pub fn fused_tensors(
    weights: &ModelWeights<'_>,
    plan: &FusionPlan,
    layer: usize,
) -> Result<Vec<(String, Tensor<'static>)>> {
    let mut out = Vec::new();
    let get = |s: &str| {
        let name = format!("blk.{layer}.{s}");
        weights
            .tensors
            .get(&name)
            .ok_or_else(|| Error::format("model", format!("missing tensor `{name}`")))
    };
    let bias = |s: &str| weights.tensors.get(&format!("blk.{layer}.{s}.bias"));
    if plan.qkv.get(layer).copied().unwrap_or(false) {
        let c = &weights.config;
        let parts = ["attn_q", "attn_k", "attn_v"];
        let mut mats = parts
            .iter()
            .map(|p| get(&format!("{p}.weight")).map(Cow::Borrowed))
            .collect::<Result<Vec<Cow<'_, Tensor<'_>>>>>()?;
        let mut biases: Vec<Option<Tensor<'_>>> = parts.iter().map(|p| bias(p).cloned()).collect();
        if c.rope_layout == RopeLayout::RotateHalf {
            for (i, heads) in [(0, c.n_heads), (1, c.n_kv_heads)] {
                let order = half_to_pairs(heads, c.head_dim);
                mats[i] = Cow::Owned(permute_rows(&mats[i], &order)?);
                if let Some(b) = &biases[i] {
                    let values = bias_values(Some(b), order.len(), "bias")?;
                    biases[i] = Some(f32_tensor(order.iter().map(|&r| values[r]).collect()));
                }
            }
        }
        let refs: Vec<&Tensor<'_>> = mats.iter().map(|m| m.as_ref()).collect();
        out.push((qkv_name(layer, "weight"), stack_rows(&refs)?));
        let bias_refs: Vec<Option<&Tensor<'_>>> = biases.iter().map(Option::as_ref).collect();
        if let Some(b) = stacked_bias(&refs, &bias_refs, &qkv_name(layer, "bias"))? {
            out.push((qkv_name(layer, "bias"), b));
        }
    }
    if plan.gate_up.get(layer).copied().unwrap_or(false) {
        let (gate, up) = (get("ffn_gate.weight")?, get("ffn_up.weight")?);
        out.push((gate_up_name(layer, "weight"), interleave_rows(gate, up)?));
        let (gb, ub) = (bias("ffn_gate"), bias("ffn_up"));
        if gb.is_some() || ub.is_some() {
            let rows = gate.shape[0];
            let g = bias_values(gb, rows, "ffn_gate.bias")?;
            let u = bias_values(ub, rows, "ffn_up.bias")?;
            let values: Vec<f32> = g.iter().zip(&u).flat_map(|(&a, &b)| [a, b]).collect();
            out.push((gate_up_name(layer, "bias"), f32_tensor(values)));
        }
    }
    Ok(out)
}

/// Bytes of one row of `t` (`[rows, cols]`).
fn row_bytes(t: &Tensor<'_>) -> Result<usize> {
    let cols = t.shape.get(1).copied().unwrap_or(0) as u64;
    let bytes = t.dtype.bytes_for(cols, "row")?;
    let rows = t.shape.first().copied().unwrap_or(0);
    if (bytes as usize).checked_mul(rows) != Some(t.data.len()) {
        return Err(Error::format(
            "model",
            format!(
                "tensor {:?} {} holds {} bytes, not {rows} rows of {bytes}",
                t.shape,
                t.dtype,
                t.data.len()
            ),
        ));
    }
    Ok(bytes as usize)
}

/// `[Σ rows, cols]`: the parts' rows one after the other.
pub fn stack_rows(parts: &[&Tensor<'_>]) -> Result<Tensor<'static>> {
    let first = parts
        .first()
        .ok_or_else(|| Error::invalid("parts", "nothing to stack"))?;
    let mut data = Vec::with_capacity(parts.iter().map(|p| p.data.len()).sum());
    let mut rows = 0;
    for p in parts {
        row_bytes(p)?;
        data.extend_from_slice(&p.data);
        rows += p.shape[0];
    }
    Ok(Tensor {
        shape: vec![rows, first.shape[1]],
        dtype: first.dtype,
        data: Cow::Owned(data),
    })
}

/// The source row of each new row when the pairs `(i, i + head_dim/2)` of `heads` heads move
/// to rows `(2i, 2i+1)` of their head.
pub fn half_to_pairs(heads: usize, head_dim: usize) -> Vec<usize> {
    let half = head_dim / 2;
    (0..heads * head_dim)
        .map(|r| {
            let (head, j) = (r / head_dim, r % head_dim);
            head * head_dim + if j % 2 == 0 { j / 2 } else { half + j / 2 }
        })
        .collect()
}

/// The rows of `t` in the order `order` names them (`order[new] = old`).
pub fn permute_rows(t: &Tensor<'_>, order: &[usize]) -> Result<Tensor<'static>> {
    let rb = row_bytes(t)?;
    let rows = t.shape[0];
    if order.len() != rows || order.iter().any(|&r| r >= rows) {
        return Err(Error::format(
            "model",
            format!(
                "cannot permute {rows} rows of {:?} into {} rows",
                t.shape,
                order.len()
            ),
        ));
    }
    let mut data = Vec::with_capacity(t.data.len());
    for &r in order {
        data.extend_from_slice(&t.data[r * rb..(r + 1) * rb]);
    }
    Ok(Tensor {
        shape: t.shape.clone(),
        dtype: t.dtype,
        data: Cow::Owned(data),
    })
}

/// `[2·rows, cols]`: rows `a₀, b₀, a₁, b₁, …` of two matrices of the same shape and type.
pub fn interleave_rows(a: &Tensor<'_>, b: &Tensor<'_>) -> Result<Tensor<'static>> {
    if a.shape != b.shape || a.dtype != b.dtype {
        return Err(Error::invalid(
            "b",
            format!(
                "{:?} {} cannot interleave with {:?} {}",
                b.shape, b.dtype, a.shape, a.dtype
            ),
        ));
    }
    let rb = row_bytes(a)?;
    let mut data = Vec::with_capacity(a.data.len() * 2);
    for (ra, rbytes) in a.data.chunks_exact(rb).zip(b.data.chunks_exact(rb)) {
        data.extend_from_slice(ra);
        data.extend_from_slice(rbytes);
    }
    Ok(Tensor {
        shape: vec![a.shape[0] * 2, a.shape[1]],
        dtype: a.dtype,
        data: Cow::Owned(data),
    })
}

fn f32_tensor(values: Vec<f32>) -> Tensor<'static> {
    Tensor {
        shape: vec![values.len()],
        dtype: DType::F32,
        data: Cow::Owned(bytemuck::cast_slice(&values).to_vec()),
    }
}

/// A bias of `rows` values as f32 (zeros when absent).
fn bias_values(t: Option<&Tensor<'_>>, rows: usize, what: &str) -> Result<Vec<f32>> {
    let Some(t) = t else {
        return Ok(vec![0.0; rows]);
    };
    if t.n_elements() != rows {
        return Err(Error::format(
            "model",
            format!(
                "bias `{what}` has {} values for {rows} rows",
                t.n_elements()
            ),
        ));
    }
    dequantize(t.dtype, &t.data, rows as u64, what)
}

fn stacked_bias(
    mats: &[&Tensor<'_>],
    biases: &[Option<&Tensor<'_>>],
    what: &str,
) -> Result<Option<Tensor<'static>>> {
    if biases.iter().all(Option::is_none) {
        return Ok(None);
    }
    let mut values = Vec::new();
    for (m, b) in mats.iter().zip(biases) {
        values.extend(bias_values(*b, m.shape[0], what)?);
    }
    Ok(Some(f32_tensor(values)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(rows: usize, cols: usize, dtype: DType, fill: u8) -> Tensor<'static> {
        let bytes = dtype.bytes_for((rows * cols) as u64, "t").unwrap() as usize;
        Tensor {
            shape: vec![rows, cols],
            dtype,
            data: Cow::Owned((0..bytes).map(|i| fill.wrapping_add(i as u8)).collect()),
        }
    }

    #[test]
    fn stacking_and_interleaving_move_whole_rows() {
        let (a, b) = (t(3, 64, DType::Q8_0, 0), t(3, 64, DType::Q8_0, 100));
        let rb = 2 * 34;
        let s = stack_rows(&[&a, &b]).unwrap();
        assert_eq!(s.shape, vec![6, 64]);
        assert_eq!(&s.data[..3 * rb], &a.data[..]);
        assert_eq!(&s.data[3 * rb..], &b.data[..]);
        let i = interleave_rows(&a, &b).unwrap();
        assert_eq!(i.shape, vec![6, 64]);
        for r in 0..3 {
            assert_eq!(
                &i.data[2 * r * rb..(2 * r + 1) * rb],
                &a.data[r * rb..(r + 1) * rb]
            );
            assert_eq!(
                &i.data[(2 * r + 1) * rb..(2 * r + 2) * rb],
                &b.data[r * rb..(r + 1) * rb]
            );
        }
        let c = t(3, 64, DType::F16, 0);
        assert!(interleave_rows(&a, &c).is_err());
        assert!(!compatible(&[Some(&a), Some(&c)]));
        assert!(!compatible(&[Some(&a), None]));
        assert!(compatible(&[Some(&a), Some(&b)]));
    }

    #[test]
    fn half_pairs_become_adjacent_rows() {
        // head_dim 4: pairs (0, 2), (1, 3) -> rows (0, 1), (2, 3); second head likewise
        assert_eq!(half_to_pairs(2, 4), vec![0, 2, 1, 3, 4, 6, 5, 7]);
        let m = t(4, 32, DType::Q8_0, 7);
        let p = permute_rows(&m, &[3, 2, 1, 0]).unwrap();
        assert_eq!(&p.data[..34], &m.data[3 * 34..]);
        assert!(permute_rows(&m, &[0, 1]).is_err());
        assert!(permute_rows(&m, &[0, 1, 2, 4]).is_err());
    }

    #[test]
    fn replaced_names_follow_the_plan() {
        let plan = FusionPlan {
            qkv: vec![true, false],
            gate_up: vec![false, true],
        };
        assert!(plan.replaced("blk.0.attn_q.weight"));
        assert!(plan.replaced("blk.0.attn_v.bias"));
        assert!(!plan.replaced("blk.1.attn_k.weight"));
        assert!(!plan.replaced("blk.0.ffn_up.weight"));
        assert!(plan.replaced("blk.1.ffn_gate.weight"));
        assert!(!plan.replaced("blk.1.attn_output.weight"));
        assert!(!plan.replaced("blk.7.attn_q.weight"));
        assert!(!plan.replaced("token_embd.weight"));
        assert!(plan.any_separate_qkv() && plan.any_separate_gate_up());
    }
}
