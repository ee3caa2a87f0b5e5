//! What the CPU backend holds in a wasm32 module's 4 GiB address space: the files, the weights
//! made on load, and the KV cache; the longest context that fits, and the refusal, with the
//! numbers, of a model that does not.

use crate::config::{ContextChoice, ModelConfig};
use crate::error::{Error, Result};
use crate::model::file_bytes::WASM32_ADDRESS_SPACE;
use crate::model::weights::ModelWeights;

/// Bytes the CPU backend holds for `weights` beside the files: matrices made on load (the others
/// stay in the file's bytes, [`ModelWeights::keep`]) and the vectors again as f32.
fn held_beside_the_files(weights: &ModelWeights<'_>) -> u64 {
    weights
        .tensors
        .values()
        .map(|t| match t.shape.len() {
            2 if weights
                .sources
                .iter()
                .any(|f| f.range_of(&t.data).is_some()) =>
            {
                0
            }
            2 => t.data.len() as u64,
            _ => t.n_elements() as u64 * 4,
        })
        .sum()
}

/// Bytes of the f32 KV cache of `context` positions (every layer at full length: an upper bound
/// for models with local layers).
fn kv_bytes(config: &ModelConfig, context: usize) -> u64 {
    [
        config.n_layers as u64,
        context as u64,
        config.kv_dim() as u64,
    ]
    .iter()
    .fold(2 * 4, |n: u64, &f| n.saturating_mul(f))
}

/// What a wasm32 module holds for the CPU backend: the files (their whole length, metadata and
/// all, where the weights know them; else the tensors' bytes), what is held beside them and
/// the KV cache of `context` positions.
fn address_space_needed(weights: &ModelWeights<'_>, context: usize) -> u64 {
    let files = if weights.sources.is_empty() {
        weights.weight_bytes()
    } else {
        weights.sources.iter().map(|f| f.len() as u64).sum()
    };
    files
        .saturating_add(held_beside_the_files(weights))
        .saturating_add(kv_bytes(&weights.config, context))
}

/// The longest context, up to `wanted`, whose KV cache fits `space` bytes beside the files and
/// the weights held (see [`address_space_needed`]); `None` when not even one position fits.
pub fn longest_context_within(
    weights: &ModelWeights<'_>,
    wanted: usize,
    space: u64,
) -> Option<usize> {
    let fixed = address_space_needed(weights, 0);
    let per_position = kv_bytes(&weights.config, 1).max(1);
    let positions = space.checked_sub(fixed)? / per_position;
    let context = usize::try_from(positions).unwrap_or(usize::MAX).min(wanted);
    (context >= 1).then_some(context)
}

/// The context the CPU backend takes when the caller gives none: `wanted` (the model's, at most
/// 4096); where `space` bounds what the module can hold (wasm32: 4 GiB), the longest context
/// that fits beside the files and the weights held, so that a large model gets a shorter
/// context instead of a refusal. When not even one position fits, `wanted` stays and the load
/// is refused with the numbers.
pub fn context_for(weights: &ModelWeights<'_>, wanted: usize, space: Option<u64>) -> ContextChoice {
    let default = ContextChoice {
        context: wanted,
        reason: "the model's context, at most 4096".into(),
    };
    let Some(space) = space else {
        return default;
    };
    if address_space_needed(weights, wanted) <= space {
        return default;
    }
    match longest_context_within(weights, wanted, space) {
        Some(context) => ContextChoice {
            context,
            reason: format!(
                "the longest whose f32 KV cache fits the {space}-byte address space beside the \
                 model ({} bytes held; {wanted} positions would need {})",
                address_space_needed(weights, 0),
                address_space_needed(weights, wanted)
            ),
        },
        None => default,
    }
}

/// Refuses, with the numbers, a model whose files, weights as held here and KV cache would not
/// fit the address space of a wasm32 module together (the files stay in memory: the engine
/// keeps them to load the model again). Natively there is no such limit.
pub fn check_address_space(weights: &ModelWeights<'_>, context: usize) -> Result<()> {
    let needed = address_space_needed(weights, context);
    if cfg!(target_arch = "wasm32") && needed > WASM32_ADDRESS_SPACE {
        return Err(Error::Limit {
            what: format!(
                "{} on the CPU backend: the file, the weights and an f32 KV cache of {context} \
                 positions",
                weights.file
            ),
            limit: "wasm32 address space",
            needed,
            allowed: WASM32_ADDRESS_SPACE,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::gguf_model::GgufModel;

    #[test]
    fn a_bounded_address_space_shortens_the_default_context() {
        let bytes = include_bytes!("../../../../tests/fixtures/tiny-llama-q4_1.gguf");
        let model = GgufModel::from_bytes(bytes.to_vec(), "tiny-llama-q4_1.gguf").unwrap();
        let w = model.weights().unwrap();
        let per_position = kv_bytes(&w.config, 1);
        let fixed = address_space_needed(&w, 0);
        // no bound, or room for every wanted position: the default
        assert_eq!(context_for(&w, 128, None).context, 128);
        assert_eq!(
            context_for(&w, 128, Some(fixed + 128 * per_position)).context,
            128
        );
        // room for 100 positions (and a little more): 100, and the reason says why
        let c = context_for(&w, 128, Some(fixed + 100 * per_position + per_position / 2));
        assert_eq!(c.context, 100);
        assert!(c.reason.contains("address space"), "{}", c.reason);
        // not one position: the default stays, and the load's check refuses it
        assert_eq!(context_for(&w, 128, Some(fixed)).context, 128);
        assert_eq!(longest_context_within(&w, 128, fixed), None);
    }
}
