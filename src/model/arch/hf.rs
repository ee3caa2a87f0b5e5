//! What the architectures read of a Hugging Face `config.json`: its fields, the RoPE scaling
//! block, and the tensor names of the Llama layout several families share.

use serde::Deserialize;

use crate::config::RopeScaling;
use crate::error::{Error, Result};

/// A token id or a list of them (`eos_token_id` is either in the wild).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One id.
    One(u32),
    /// A list.
    Many(Vec<u32>),
}

impl OneOrMany {
    /// The ids as a list.
    pub fn into_vec(self) -> Vec<u32> {
        match self {
            OneOrMany::One(id) => vec![id],
            OneOrMany::Many(ids) => ids,
        }
    }
}

/// The union of the `config.json` fields every architecture reads; absent fields are `None`.
/// Each field is the key of the same name.
#[derive(Debug, Default, Deserialize)]
pub struct HfConfig {
    pub(crate) model_type: Option<String>,
    pub(crate) vocab_size: Option<usize>,
    // llama family
    pub(crate) hidden_size: Option<usize>,
    pub(crate) intermediate_size: Option<usize>,
    pub(crate) num_hidden_layers: Option<usize>,
    pub(crate) num_attention_heads: Option<usize>,
    pub(crate) num_key_value_heads: Option<usize>,
    pub(crate) head_dim: Option<usize>,
    pub(crate) max_position_embeddings: Option<usize>,
    pub(crate) rms_norm_eps: Option<f32>,
    pub(crate) rope_theta: Option<f32>,
    pub(crate) rope_scaling: Option<serde_json::Value>,
    pub(crate) hidden_act: Option<String>,
    pub(crate) attention_bias: Option<bool>,
    /// Mistral 7B v0.1, Phi-3: attention over the latest `sliding_window` keys only.
    pub(crate) sliding_window: Option<usize>,
    // gemma3_text
    pub(crate) hidden_activation: Option<String>,
    pub(crate) query_pre_attn_scalar: Option<f64>,
    pub(crate) rope_local_base_freq: Option<f32>,
    pub(crate) sliding_window_pattern: Option<usize>,
    pub(crate) layer_types: Option<Vec<String>>,
    pub(crate) final_logit_softcapping: Option<f64>,
    pub(crate) attn_logit_softcapping: Option<f64>,
    // gpt2
    pub(crate) n_embd: Option<usize>,
    pub(crate) n_inner: Option<usize>,
    pub(crate) n_layer: Option<usize>,
    pub(crate) n_head: Option<usize>,
    pub(crate) n_positions: Option<usize>,
    pub(crate) layer_norm_epsilon: Option<f32>,
    pub(crate) activation_function: Option<String>,
    // bert
    pub(crate) layer_norm_eps: Option<f32>,
    pub(crate) type_vocab_size: Option<usize>,
    pub(crate) position_embedding_type: Option<String>,
    pub(crate) is_decoder: Option<bool>,
    // common
    pub(crate) tie_word_embeddings: Option<bool>,
    pub(crate) bos_token_id: Option<OneOrMany>,
    pub(crate) eos_token_id: Option<OneOrMany>,
}

/// `value`, or an error naming the missing `key` of `file`.
pub fn required(value: Option<usize>, key: &str, file: &str) -> Result<usize> {
    value.ok_or_else(|| Error::format(file, format!("missing required field `{key}`")))
}

/// The error for a `config.json` setting the engine does not run, described by `what`.
pub fn unsupported(file: &str, what: String) -> Error {
    Error::Unsupported {
        file: file.to_string(),
        what,
    }
}

/// The RoPE scaling of `raw` (none when absent or `null`), `file` naming it in errors.
pub fn rope_scaling_of(raw: &HfConfig, file: &str) -> Result<RopeScaling> {
    match raw.rope_scaling.as_ref().filter(|v| !v.is_null()) {
        None => Ok(RopeScaling::None),
        Some(v) => rope_scaling(v, raw.max_position_embeddings.unwrap_or(0))
            .map_err(|what| unsupported(file, what)),
    }
}

/// `rope_scaling` of a `config.json`: `linear`, `llama3` and `yarn` (`rope_type`, or `type`
/// in older files; YaRN's original context defaults to `context`, the model's own, its betas
/// to 32 and 1, its attention factor to `attention_factor`, else Hugging Face's
/// `mscale` / `mscale_all_dim` ratio, else `0.1 · ln(factor) + 1`); anything else, or a
/// missing or non-numeric field, is refused with what it was.
pub fn rope_scaling(
    v: &serde_json::Value,
    context: usize,
) -> std::result::Result<RopeScaling, String> {
    let kind = v
        .get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(|t| t.as_str())
        .unwrap_or("");
    let number = |key: &str| {
        v.get(key)
            .and_then(|x| x.as_f64())
            .map(|x| x as f32)
            .ok_or_else(|| format!("rope_scaling {v} (`{key}` missing or not a number)"))
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear {
            factor: number("factor")?,
        }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: number("factor")?,
            low_freq_factor: number("low_freq_factor")?,
            high_freq_factor: number("high_freq_factor")?,
            original_context: number("original_max_position_embeddings")? as usize,
        }),
        "yarn" => {
            let factor = number("factor")?;
            let or = |key: &str, default: f32| match v.get(key) {
                None | Some(serde_json::Value::Null) => Ok(default),
                Some(_) => number(key),
            };
            // Hugging Face's `get_mscale`
            let mscale = |scale: f32, m: f32| match scale <= 1.0 {
                true => 1.0,
                false => 0.1 * m * crate::math::ln(f64::from(scale)) as f32 + 1.0,
            };
            let default_factor = match (or("mscale", 0.0)?, or("mscale_all_dim", 0.0)?) {
                (m, all) if m != 0.0 && all != 0.0 => mscale(factor, m) / mscale(factor, all),
                _ => crate::config::yarn_default_attention_factor(factor),
            };
            Ok(RopeScaling::Yarn {
                factor,
                original_context: or("original_max_position_embeddings", context as f32)? as usize,
                beta_fast: or("beta_fast", 32.0)?,
                beta_slow: or("beta_slow", 1.0)?,
                attention_factor: or("attention_factor", default_factor)?,
            })
        }
        _ => Err(format!(
            "rope_scaling {v} (supported: `linear`, `llama3` and `yarn`)"
        )),
    }
}

/// The GGUF name of a tensor of the Llama family's layout (`model.embed_tokens`,
/// `model.layers.N.*`, `model.norm`, `lm_head`): `own(module)` first, for the modules the
/// architecture names its own way, then the modules every member shares.
pub fn llama_layout_name(
    hf_name: &str,
    own: impl Fn(&str) -> Option<&'static str>,
) -> Option<String> {
    let n = hf_name.strip_prefix("model.").unwrap_or(hf_name);
    match n {
        "embed_tokens.weight" => return Some("token_embd.weight".into()),
        "norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let (layer, rest) = split_layer(n.strip_prefix("layers.")?)?;
    let (module, suffix) = rest.rsplit_once('.')?;
    let gguf = own(module).or(match module {
        "input_layernorm" => Some("attn_norm"),
        "self_attn.q_proj" => Some("attn_q"),
        "self_attn.k_proj" => Some("attn_k"),
        "self_attn.v_proj" => Some("attn_v"),
        "self_attn.o_proj" => Some("attn_output"),
        // Qwen3's and Gemma 3's QK-norm gains
        "self_attn.q_norm" => Some("attn_q_norm"),
        "self_attn.k_norm" => Some("attn_k_norm"),
        "mlp.gate_proj" => Some("ffn_gate"),
        "mlp.up_proj" => Some("ffn_up"),
        "mlp.down_proj" => Some("ffn_down"),
        _ => None,
    })?;
    Some(format!("blk.{layer}.{gguf}.{suffix}"))
}

/// `"3.rest"` to `(3, "rest")`.
pub fn split_layer(s: &str) -> Option<(usize, &str)> {
    let (layer, rest) = s.split_once('.')?;
    Some((layer.parse().ok()?, rest))
}
