//! The model's final norm on the host, for a GPU step that reads back hidden states
//! ([`super::Readback::Hidden`]): the residual stream is copied out as it is after the last
//! layer and normalised here, so that no kernel runs a norm on its own (the GPU's norms are
//! folded into the linears that read them).

use crate::backend::cpu::ops;
use crate::config::{ModelConfig, NormKind};
use crate::dtype::dequantize;
use crate::error::Result;
use crate::model::graph::Graph;
use crate::model::weights::ModelWeights;

/// The final norm's parameters as f32, `[d]` each.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct FinalNorm {
    kind: NormKind,
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
    eps: f32,
}

impl FinalNorm {
    /// The norm before `graph`'s head, read from `weights`; `None` when the head has none.
    pub(super) fn of(
        graph: &Graph,
        config: &ModelConfig,
        weights: &ModelWeights<'_>,
    ) -> Result<Option<Self>> {
        let Some(norm) = graph.head.as_ref().and_then(|h| h.norm.as_ref()) else {
            return Ok(None);
        };
        let vector = |name: &str| -> Result<Vec<f32>> {
            let t = weights.tensor(name)?;
            dequantize(t.dtype, &t.data, t.n_elements() as u64, name)
        };
        Ok(Some(Self {
            kind: norm.kind,
            weight: vector(&norm.weight)?,
            bias: norm.bias.as_deref().map(vector).transpose()?,
            eps: config.norm_eps,
        }))
    }

    /// Every row of `x` (`[tokens, d]`) normalised, in place.
    pub(super) fn apply(&self, x: &mut [f32]) {
        let input = x.to_vec();
        let bias = self.bias.as_deref();
        ops::norm(self.kind, &input, &self.weight, bias, self.eps, x);
    }
}
