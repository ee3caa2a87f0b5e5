//! What the CPU backend holds in a wasm32 module's 4 GiB address space: the files, the weights
//! made on load, and the KV cache; the longest context that fits, and the refusal, with the
//! numbers, of a model that does not.

use crate::config::{ContextChoice, ModelConfig};
use crate::dtype::kv::KvKinds;
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

/// Bytes of a KV cache of `context` positions in `kinds` (every layer at full length: an upper
/// bound for models with local layers).
fn kv_bytes(config: &ModelConfig, context: usize, kinds: KvKinds) -> u64 {
    kinds
        .row_bytes(config.kv_dim())
        .saturating_mul(config.n_layers as u64)
        .saturating_mul(context as u64)
}

/// The kinds in words, for messages (`f32`, or `K q8_0 / V f16`).
fn kinds_name(kinds: KvKinds) -> String {
    match kinds.k == kinds.v {
        true => kinds.k.name().to_string(),
        false => format!("K {} / V {}", kinds.k.name(), kinds.v.name()),
    }
}

/// What a wasm32 module holds for the CPU backend: the files (their whole length, metadata and
/// all, where the weights know them; else the tensors' bytes), what is held beside them and
/// the KV cache of `context` positions in `kinds`.
fn address_space_needed(weights: &ModelWeights<'_>, context: usize, kinds: KvKinds) -> u64 {
    let files = if weights.sources.is_empty() {
        weights.weight_bytes()
    } else {
        weights.sources.iter().map(|f| f.len() as u64).sum()
    };
    files
        .saturating_add(held_beside_the_files(weights))
        .saturating_add(kv_bytes(&weights.config, context, kinds))
}

/// The longest context, up to `wanted`, whose KV cache in `kinds` fits `space` bytes beside the files and
/// the weights held (see [`address_space_needed`]); `None` when not even one position fits.
pub fn longest_context_within(
    weights: &ModelWeights<'_>,
    wanted: usize,
    space: u64,
    kinds: KvKinds,
) -> Option<usize> {
    let fixed = address_space_needed(weights, 0, kinds);
    let per_position = kv_bytes(&weights.config, 1, kinds).max(1);
    let positions = space.checked_sub(fixed)? / per_position;
    let context = usize::try_from(positions).unwrap_or(usize::MAX).min(wanted);
    (context >= 1).then_some(context)
}

/// The context the CPU backend takes when the caller gives none: `wanted` (the model's, at most
/// 4096); where `space` bounds what the module can hold (wasm32: 4 GiB), the longest context
/// that fits beside the files and the weights held, so that a large model gets a shorter
/// context instead of a refusal. When not even one position fits, `wanted` stays and the load
/// is refused with the numbers.
pub fn context_for(
    weights: &ModelWeights<'_>,
    wanted: usize,
    space: Option<u64>,
    kinds: KvKinds,
) -> ContextChoice {
    let default = ContextChoice {
        context: wanted,
        reason: "the model's context, at most 4096".into(),
    };
    let Some(space) = space else {
        return default;
    };
    if address_space_needed(weights, wanted, kinds) <= space {
        return default;
    }
    match longest_context_within(weights, wanted, space, kinds) {
        Some(context) => ContextChoice {
            context,
            reason: format!(
                "the longest whose {} KV cache fits the {space}-byte address space beside the \
                 model ({} bytes held; {wanted} positions would need {})",
                kinds_name(kinds),
                address_space_needed(weights, 0, kinds),
                address_space_needed(weights, wanted, kinds)
            ),
        },
        None => default,
    }
}

/// Refuses, with the numbers, a model whose files, weights as held here and KV cache would not
/// fit the address space of a wasm32 module together (files read whole stay in memory: the
/// engine keeps them to load the model again; for a model read by range, `weights` describes
/// the tensors without their files' bytes and they count once, as the backend holds them).
/// Natively there is no such limit.
pub fn check_address_space(
    weights: &ModelWeights<'_>,
    context: usize,
    kinds: KvKinds,
) -> Result<()> {
    let needed = address_space_needed(weights, context, kinds);
    if cfg!(target_arch = "wasm32") && needed > WASM32_ADDRESS_SPACE {
        return Err(Error::Limit {
            what: format!(
                "{} on the CPU backend: {} and a {} KV cache of {context} positions",
                weights.file,
                match weights.sources.is_empty() {
                    true => "the weights (read by range, the file not held)",
                    false => "the file (held whole) and the weights made from it",
                },
                kinds_name(kinds)
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
        let f32s = KvKinds::default();
        let per_position = kv_bytes(&w.config, 1, f32s);
        let fixed = address_space_needed(&w, 0, f32s);
        // no bound, or room for every wanted position: the default
        assert_eq!(context_for(&w, 128, None, f32s).context, 128);
        assert_eq!(
            context_for(&w, 128, Some(fixed + 128 * per_position), f32s).context,
            128
        );
        // room for 100 positions (and a little more): 100, and the reason says why
        let room = fixed + 100 * per_position + per_position / 2;
        let c = context_for(&w, 128, Some(room), f32s);
        assert_eq!(c.context, 100);
        assert!(c.reason.contains("address space"), "{}", c.reason);
        // not one position: the default stays, and the load's check refuses it
        assert_eq!(context_for(&w, 128, Some(fixed), f32s).context, 128);
        assert_eq!(longest_context_within(&w, 128, fixed, f32s), None);
        // the same room holds more positions of a smaller kind, and the reason names it
        let q8 = KvKinds::both(crate::dtype::kv::KvKind::Q8_0);
        let c = context_for(&w, 512, Some(room), q8);
        let q8_position = kv_bytes(&w.config, 1, q8);
        assert!(q8_position * 3 < per_position);
        assert_eq!(
            c.context as u64,
            (room - address_space_needed(&w, 0, q8)) / q8_position
        );
        assert!(c.context > 300, "{}", c.context);
        assert!(c.reason.contains("q8_0"), "{}", c.reason);
    }
}
