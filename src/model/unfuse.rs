//! Phi-3 stores each layer's Q, K and V projections as one `attn_qkv` matrix and the gate and
//! up projections as one `ffn_up` matrix of twice the feed-forward width (gate rows first).
//! The engine's Llama graph reads them apart (and fuses them again its own way, see
//! `model::fuse`), so a loader splits them by rows here: quantized rows are whole blocks, so
//! a row range is a byte range and nothing is dequantized.

#![deny(clippy::arithmetic_side_effects)]

use std::borrow::Cow;

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::model::weights::Tensor;

/// Rows `[from, from + n)` of a `[rows, cols]` tensor, as a tensor of its own.
fn rows(t: &Tensor<'_>, from: usize, n: usize, name: &str) -> Result<Tensor<'static>> {
    let [total, cols] = t.shape[..] else {
        return Err(Error::invalid(
            "tensor",
            format!("`{name}` must be a matrix, got shape {:?}", t.shape),
        ));
    };
    let end = from
        .checked_add(n)
        .filter(|&end| end <= total)
        .ok_or_else(|| {
            Error::invalid(
                "tensor",
                format!("`{name}` has {total} rows, {from} + {n} are needed"),
            )
        })?;
    let row_bytes = t.dtype.bytes_for(cols as u64, name)? as usize;
    let range = from
        .checked_mul(row_bytes)
        .zip(end.checked_mul(row_bytes))
        .map(|(a, b)| a..b);
    let bytes = range.and_then(|r| t.data.get(r)).ok_or_else(|| {
        Error::invalid(
            "tensor",
            format!("`{name}` holds fewer bytes than its shape"),
        )
    })?;
    Ok(Tensor {
        shape: vec![n, cols],
        dtype: t.dtype,
        data: Cow::Owned(bytes.to_vec()),
    })
}

/// The layer `L` of a tensor named `blk.L.attn_qkv.weight` or `blk.L.ffn_up.weight`.
fn fused_layer(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, what) = rest.split_once('.')?;
    matches!(what, "attn_qkv.weight" | "ffn_up.weight")
        .then(|| layer.parse().ok())
        .flatten()
}

/// Whether `tensors` (a file's) hold any matrix that [`split_fused`] would split.
pub fn stacks_any(
    config: &ModelConfig,
    tensors: &std::collections::BTreeMap<String, Tensor<'_>>,
) -> bool {
    let ff2 = config.ffn_size.saturating_mul(2);
    tensors.iter().any(|(name, t)| {
        fused_layer(name).is_some_and(|layer| {
            name.ends_with(".attn_qkv.weight")
                || (name.ends_with(".ffn_up.weight")
                    && t.shape.first() == Some(&ff2)
                    && !tensors.contains_key(&format!("blk.{layer}.ffn_gate.weight")))
        })
    })
}

/// Splits every layer's fused `attn_qkv.weight` (`[q_dim + 2·kv_dim, d]`) into `attn_q`,
/// `attn_k` and `attn_v`, and every `ffn_up.weight` of `2·ffn_size` rows into `ffn_gate`
/// (the first half) and `ffn_up`, for a Llama-graph model whose file fuses them. Layers that
/// already hold the separate tensors are left alone. Only the layers that hold such a tensor
/// are visited, so the time follows the file's tensors, not the layer count its header claims.
pub fn split_fused(
    config: &ModelConfig,
    tensors: &mut std::collections::BTreeMap<String, Tensor<'_>>,
) -> Result<()> {
    let (q, kv, ff) = (config.q_dim(), config.kv_dim(), config.ffn_size);
    let layers: std::collections::BTreeSet<usize> = tensors
        .keys()
        .filter_map(|name| fused_layer(name))
        .filter(|&layer| layer < config.n_layers)
        .collect();
    for layer in layers {
        let qkv = format!("blk.{layer}.attn_qkv.weight");
        if let Some(t) = tensors.remove(&qkv) {
            tensors.insert(format!("blk.{layer}.attn_q.weight"), rows(&t, 0, q, &qkv)?);
            tensors.insert(format!("blk.{layer}.attn_k.weight"), rows(&t, q, kv, &qkv)?);
            tensors.insert(
                format!("blk.{layer}.attn_v.weight"),
                rows(&t, q.saturating_add(kv), kv, &qkv)?,
            );
        }
        let up = format!("blk.{layer}.ffn_up.weight");
        let gate = format!("blk.{layer}.ffn_gate.weight");
        let fused = !tensors.contains_key(&gate)
            && tensors
                .get(&up)
                .is_some_and(|t| t.shape.first() == Some(&ff.saturating_mul(2)));
        if fused {
            if let Some(t) = tensors.remove(&up) {
                tensors.insert(gate, rows(&t, 0, ff, &up)?);
                tensors.insert(up.clone(), rows(&t, ff, ff, &up)?);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::tiny_llama;
    use crate::dtype::DType;

    fn f32_tensor(shape: Vec<usize>) -> Tensor<'static> {
        let n: usize = shape.iter().product();
        Tensor {
            shape,
            dtype: DType::F32,
            data: Cow::Owned((0..n).flat_map(|i| (i as f32).to_le_bytes()).collect()),
        }
    }

    /// A header may claim any layer count: the split visits the layers the file holds (a
    /// loop over 2^40 claimed layers did not end).
    #[test]
    fn a_huge_claimed_layer_count_costs_nothing() {
        let mut c = tiny_llama();
        c.n_layers = 1 << 40;
        let (q, kv, d) = (c.q_dim(), c.kv_dim(), c.hidden_size);
        let mut t = std::collections::BTreeMap::new();
        t.insert(
            "blk.7.attn_qkv.weight".to_string(),
            f32_tensor(vec![q + 2 * kv, d]),
        );
        t.insert("blk.x.attn_qkv.weight".to_string(), f32_tensor(vec![1, 1]));
        split_fused(&c, &mut t).unwrap();
        assert_eq!(t["blk.7.attn_k.weight"].shape, vec![kv, d]);
        assert!(t.contains_key("blk.x.attn_qkv.weight"));
        assert_eq!(fused_layer("blk.12.ffn_up.weight"), Some(12));
        assert_eq!(fused_layer("blk.12.ffn_gate.weight"), None);
        assert_eq!(fused_layer("blk.1.attn_qkv.bias"), None);
    }

    #[test]
    fn fused_matrices_split_by_rows_and_bad_ones_are_named() {
        let c = tiny_llama();
        let (q, kv, ff, d) = (c.q_dim(), c.kv_dim(), c.ffn_size, c.hidden_size);
        let mut t = std::collections::BTreeMap::new();
        t.insert(
            "blk.0.attn_qkv.weight".to_string(),
            f32_tensor(vec![q + 2 * kv, d]),
        );
        t.insert(
            "blk.0.ffn_up.weight".to_string(),
            f32_tensor(vec![2 * ff, d]),
        );
        split_fused(&c, &mut t).unwrap();
        assert_eq!(t["blk.0.attn_k.weight"].shape, vec![kv, d]);
        // the first value of attn_v is row q + kv of the fused matrix
        let first = f32::from_le_bytes(t["blk.0.attn_v.weight"].data[..4].try_into().unwrap());
        assert_eq!(first, ((q + kv) * d) as f32);
        assert_eq!(t["blk.0.ffn_gate.weight"].shape, vec![ff, d]);
        let up = f32::from_le_bytes(t["blk.0.ffn_up.weight"].data[..4].try_into().unwrap());
        assert_eq!(up, (ff * d) as f32);
        // too few rows: refused naming the tensor
        let mut short = std::collections::BTreeMap::new();
        short.insert("blk.1.attn_qkv.weight".to_string(), f32_tensor(vec![q, d]));
        let err = split_fused(&c, &mut short).unwrap_err().to_string();
        assert!(err.contains("blk.1.attn_qkv.weight"), "{err}");
    }
}
