//! How a text's token states become one embedding vector: the poolings an embedding call
//! names, and the one a model's file names for itself (BERT's `pooling_type`).

use crate::error::{Error, Result};

/// How a text's token states become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// The mean over every token (special tokens the tokenizer adds included).
    #[default]
    Mean,
    /// The last token's state (what causal embedding models such as Qwen3-Embedding use).
    Last,
    /// The first token's state (BERT's `[CLS]`; on a causal model the first token sees
    /// nothing else).
    Cls,
}

impl Pooling {
    /// Every pooling by name.
    pub const ALL: [Pooling; 3] = [Pooling::Mean, Pooling::Last, Pooling::Cls];

    /// `mean`, `last` or `cls`.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Last => "last",
            Pooling::Cls => "cls",
        }
    }

    /// The pooling called `name` (any case), or an error listing the names.
    pub fn parse(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                Error::invalid(
                    "pooling",
                    format!("`{name}` is not a pooling (mean, last or cls)"),
                )
            })
    }

    /// `states` (`[tokens, d]`, at least one token) pooled into `[d]`.
    pub fn pool(self, states: &[f32], d: usize) -> Vec<f32> {
        let tokens = states.len() / d;
        match self {
            Pooling::Cls => states[..d].to_vec(),
            Pooling::Last => states[(tokens - 1) * d..tokens * d].to_vec(),
            Pooling::Mean => {
                // summed in f64: a long text's mean keeps its last digits
                let mut sum = vec![0f64; d];
                for row in states.chunks_exact(d) {
                    for (s, &v) in sum.iter_mut().zip(row) {
                        *s += f64::from(v);
                    }
                }
                sum.iter().map(|s| (s / tokens as f64) as f32).collect()
            }
        }
    }
}
