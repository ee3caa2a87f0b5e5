//! Hugging Face `config.json` (and `generation_config.json`) to [`ModelConfig`].

use serde::Deserialize;

use crate::config::{
    Activation, Architecture, LocalAttention, ModelConfig, NormKind, RopeLayout, RopeScaling,
    GEMMA3_LOCAL_ROPE_THETA, GEMMA3_PATTERN,
};
use crate::error::{Error, Result};

/// A token id or a list of them (`eos_token_id` is either in the wild).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<u32> {
        match self {
            OneOrMany::One(id) => vec![id],
            OneOrMany::Many(ids) => ids,
        }
    }
}

/// The union of the `config.json` fields of the supported families; absent fields are `None`.
#[derive(Debug, Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    vocab_size: Option<usize>,
    // llama family
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    max_position_embeddings: Option<usize>,
    rms_norm_eps: Option<f32>,
    rope_theta: Option<f32>,
    rope_scaling: Option<serde_json::Value>,
    hidden_act: Option<String>,
    attention_bias: Option<bool>,
    /// Mistral 7B v0.1, Phi-3: attention over the latest `sliding_window` keys only.
    sliding_window: Option<usize>,
    // gemma3_text
    hidden_activation: Option<String>,
    query_pre_attn_scalar: Option<f64>,
    rope_local_base_freq: Option<f32>,
    sliding_window_pattern: Option<usize>,
    layer_types: Option<Vec<String>>,
    final_logit_softcapping: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    // gpt2
    n_embd: Option<usize>,
    n_inner: Option<usize>,
    n_layer: Option<usize>,
    n_head: Option<usize>,
    n_positions: Option<usize>,
    layer_norm_epsilon: Option<f32>,
    activation_function: Option<String>,
    // common
    tie_word_embeddings: Option<bool>,
    bos_token_id: Option<OneOrMany>,
    eos_token_id: Option<OneOrMany>,
}

#[derive(Debug, Deserialize)]
struct RawGenerationConfig {
    bos_token_id: Option<OneOrMany>,
    eos_token_id: Option<OneOrMany>,
}

fn parse_json<'de, T: Deserialize<'de>>(bytes: &'de [u8], file: &str) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::format(file, format!("invalid JSON: {e}")))
}

fn required(value: Option<usize>, key: &str, file: &str) -> Result<usize> {
    value.ok_or_else(|| Error::format(file, format!("missing required field `{key}`")))
}

/// Parses `config.json` (named `file` in errors) and, when given, `generation_config.json`,
/// whose BOS/EOS ids take precedence (it is what generation uses).
pub fn parse_config(
    config_json: &[u8],
    generation_config_json: Option<&[u8]>,
    file: &str,
) -> Result<ModelConfig> {
    let raw: RawConfig = parse_json(config_json, file)?;
    let model_type = raw
        .model_type
        .as_deref()
        .ok_or_else(|| Error::format(file, "missing required field `model_type`"))?;
    let unsupported = |what: String| Error::Unsupported {
        file: file.to_string(),
        what,
    };
    let mut config = match model_type {
        "llama" | "mistral" | "qwen2" | "qwen3" | "phi3" => {
            let rope_scaling = match raw.rope_scaling.as_ref().filter(|v| !v.is_null()) {
                None => RopeScaling::None,
                Some(v) => rope_scaling(v, raw.max_position_embeddings.unwrap_or(0))
                    .map_err(&unsupported)?,
            };
            let act = raw.hidden_act.as_deref().unwrap_or("silu");
            if act != "silu" {
                return Err(unsupported(format!("hidden_act `{act}` (only `silu`)")));
            }
            let hidden = required(raw.hidden_size, "hidden_size", file)?;
            let heads = required(raw.num_attention_heads, "num_attention_heads", file)?;
            if heads == 0 {
                return Err(Error::format(file, "num_attention_heads is 0"));
            }
            ModelConfig {
                arch: Architecture::Llama,
                vocab_size: required(raw.vocab_size, "vocab_size", file)?,
                hidden_size: hidden,
                n_layers: required(raw.num_hidden_layers, "num_hidden_layers", file)?,
                n_heads: heads,
                n_kv_heads: raw.num_key_value_heads.unwrap_or(heads),
                head_dim: raw.head_dim.unwrap_or(hidden.checked_div(heads).unwrap_or(0)),
                ffn_size: required(raw.intermediate_size, "intermediate_size", file)?,
                // a model trained with a sliding window is exact only within it: its context
                // is capped there rather than run past it with full attention
                context_length: required(
                    raw.max_position_embeddings,
                    "max_position_embeddings",
                    file,
                )?
                .min(raw.sliding_window.filter(|&w| w > 0).unwrap_or(usize::MAX)),
                norm: NormKind::RmsNorm,
                norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
                rope_theta: raw.rope_theta.unwrap_or(10_000.0),
                rope_layout: RopeLayout::RotateHalf,
                rope_scaling,
                activation: Activation::SwiGlu,
                tied_embeddings: raw.tie_word_embeddings.unwrap_or(false),
                qkv_bias: model_type == "qwen2" || raw.attention_bias.unwrap_or(false),
                qk_norm: model_type == "qwen3",
                bos_id: None,
                eos_ids: Vec::new(),
                local_attention: None,
            }
        }
        "gpt2" => {
            let act = raw.activation_function.as_deref().unwrap_or("gelu_new");
            if !matches!(act, "gelu_new" | "gelu_pytorch_tanh") {
                return Err(unsupported(format!(
                    "activation_function `{act}` (only the tanh GELU: `gelu_new`)"
                )));
            }
            let d = required(raw.n_embd, "n_embd", file)?;
            let heads = required(raw.n_head, "n_head", file)?;
            if heads == 0 {
                return Err(Error::format(file, "n_head is 0"));
            }
            ModelConfig {
                arch: Architecture::Gpt2,
                vocab_size: required(raw.vocab_size, "vocab_size", file)?,
                hidden_size: d,
                n_layers: required(raw.n_layer, "n_layer", file)?,
                n_heads: heads,
                n_kv_heads: heads,
                head_dim: d.checked_div(heads).unwrap_or(0),
                // GPT-2's feed-forward is 4·d unless given; an n_embd too large for that is
                // refused here, before the range checks see it
                ffn_size: match raw.n_inner {
                    Some(n) => n,
                    None => d.checked_mul(4).ok_or_else(|| {
                        Error::format(
                            file,
                            format!("n_embd {d} is too large (4·n_embd overflows)"),
                        )
                    })?,
                },
                context_length: required(raw.n_positions, "n_positions", file)?,
                norm: NormKind::LayerNorm,
                norm_eps: raw.layer_norm_epsilon.unwrap_or(1e-5),
                rope_theta: 0.0,
                rope_layout: RopeLayout::None,
                rope_scaling: RopeScaling::None,
                activation: Activation::GeluTanh,
                tied_embeddings: raw.tie_word_embeddings.unwrap_or(true),
                qkv_bias: true,
                qk_norm: false,
                bos_id: None,
                eos_ids: Vec::new(),
                local_attention: None,
            }
        }
        "gemma3_text" => gemma3_text(&raw, file)?,
        "gemma3" => {
            return Err(unsupported(
                "model_type `gemma3` (the multimodal checkpoint: load its text-only form, model_type `gemma3_text`)".into(),
            ))
        }
        other => return Err(unsupported(format!("model_type `{other}`"))),
    };

    let generation: Option<RawGenerationConfig> = generation_config_json
        .map(|b| parse_json(b, "generation_config.json"))
        .transpose()?;
    let (gen_bos, gen_eos) = generation
        .map(|g| (g.bos_token_id, g.eos_token_id))
        .unwrap_or((None, None));
    config.bos_id = gen_bos
        .or(raw.bos_token_id)
        .and_then(|b| b.into_vec().first().copied());
    config.eos_ids = gen_eos
        .or(raw.eos_token_id)
        .map(OneOrMany::into_vec)
        .unwrap_or_default();
    config.validate(file)?;
    Ok(config)
}

/// Gemma 3's text model (`gemma3_text`): Hugging Face's defaults where a field is absent; the
/// local layers from `layer_types` (which must repeat one pattern of local layers then a
/// global one) or `sliding_window_pattern`; soft-capping and a query scale other than
/// `1/√head_dim` are refused by name.
fn gemma3_text(raw: &RawConfig, file: &str) -> Result<ModelConfig> {
    let unsupported = |what: String| Error::Unsupported {
        file: file.to_string(),
        what,
    };
    let act = raw
        .hidden_activation
        .as_deref()
        .unwrap_or("gelu_pytorch_tanh");
    if act != "gelu_pytorch_tanh" {
        return Err(unsupported(format!(
            "hidden_activation `{act}` (only `gelu_pytorch_tanh`)"
        )));
    }
    for (name, v) in [
        ("final_logit_softcapping", raw.final_logit_softcapping),
        ("attn_logit_softcapping", raw.attn_logit_softcapping),
    ] {
        if let Some(v) = v {
            return Err(unsupported(format!("{name} = {v} (Gemma 3 has none)")));
        }
    }
    let hidden = required(raw.hidden_size, "hidden_size", file)?;
    let heads = required(raw.num_attention_heads, "num_attention_heads", file)?;
    let head_dim = raw.head_dim.unwrap_or(256);
    if let Some(q) = raw.query_pre_attn_scalar {
        if q != head_dim as f64 {
            return Err(unsupported(format!(
                "query_pre_attn_scalar = {q} (only head_dim, {head_dim}, which scales queries by 1/√head_dim)"
            )));
        }
    }
    let n_layers = required(raw.num_hidden_layers, "num_hidden_layers", file)?;
    let pattern = match &raw.layer_types {
        None => raw.sliding_window_pattern.unwrap_or(GEMMA3_PATTERN),
        Some(types) => {
            let pattern = types
                .iter()
                .position(|t| t == "full_attention")
                .map_or(usize::MAX, |i| i.saturating_add(1));
            let expected = |i: usize| match i.saturating_add(1).is_multiple_of(pattern) {
                true => "full_attention",
                false => "sliding_attention",
            };
            if types.len() != n_layers || types.iter().enumerate().any(|(i, t)| t != expected(i)) {
                return Err(unsupported(format!(
                    "layer_types {types:?} (only a repeated run of sliding layers then one full layer, one entry per layer)"
                )));
            }
            pattern
        }
    };
    let rope_scaling = match raw.rope_scaling.as_ref().filter(|v| !v.is_null()) {
        None => RopeScaling::None,
        Some(v) => {
            rope_scaling(v, raw.max_position_embeddings.unwrap_or(0)).map_err(&unsupported)?
        }
    };
    Ok(ModelConfig {
        arch: Architecture::Gemma3,
        vocab_size: required(raw.vocab_size, "vocab_size", file)?,
        hidden_size: hidden,
        n_layers,
        n_heads: heads,
        n_kv_heads: raw.num_key_value_heads.unwrap_or(heads),
        head_dim,
        ffn_size: required(raw.intermediate_size, "intermediate_size", file)?,
        context_length: raw.max_position_embeddings.unwrap_or(131_072),
        norm: NormKind::RmsNorm,
        norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
        rope_theta: raw.rope_theta.unwrap_or(1_000_000.0),
        rope_layout: RopeLayout::RotateHalf,
        rope_scaling,
        activation: Activation::GeGlu,
        tied_embeddings: raw.tie_word_embeddings.unwrap_or(true),
        qkv_bias: raw.attention_bias.unwrap_or(false),
        qk_norm: true,
        bos_id: None,
        eos_ids: Vec::new(),
        local_attention: Some(LocalAttention {
            window: raw.sliding_window.unwrap_or(4096),
            pattern,
            rope_theta: raw.rope_local_base_freq.unwrap_or(GEMMA3_LOCAL_ROPE_THETA),
        }),
    })
}

/// `rope_scaling` of a `config.json`: `linear`, `llama3` and `yarn` (`rope_type`, or `type`
/// in older files; YaRN's original context defaults to `context`, the model's own, its betas
/// to 32 and 1, its attention factor to `attention_factor`, else Hugging Face's
/// `mscale` / `mscale_all_dim` ratio, else `0.1 · ln(factor) + 1`); anything else, or a
/// missing or non-numeric field, is refused with what it was.
fn rope_scaling(v: &serde_json::Value, context: usize) -> std::result::Result<RopeScaling, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA: &str = r#"{"model_type":"llama","vocab_size":512,"hidden_size":64,
        "intermediate_size":160,"num_hidden_layers":2,"num_attention_heads":4,
        "num_key_value_heads":2,"max_position_embeddings":128,"rms_norm_eps":1e-5,
        "rope_theta":10000.0,"hidden_act":"silu","tie_word_embeddings":false,
        "bos_token_id":0,"eos_token_id":[0, 7]}"#;

    #[test]
    fn llama_config_is_normalised() {
        let c = parse_config(LLAMA.as_bytes(), None, "config.json").unwrap();
        assert_eq!(c.arch, Architecture::Llama);
        assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (4, 2, 16));
        assert_eq!(c.rope_layout, RopeLayout::RotateHalf);
        assert_eq!(c.eos_ids, vec![0, 7]);
        assert!(!c.qkv_bias);
    }

    #[test]
    fn generation_config_overrides_eos() {
        let c = parse_config(
            LLAMA.as_bytes(),
            Some(br#"{"eos_token_id": 5}"#),
            "config.json",
        )
        .unwrap();
        assert_eq!(c.eos_ids, vec![5]);
        assert_eq!(c.bos_id, Some(0));
    }

    #[test]
    fn qwen2_has_qkv_bias() {
        let json = LLAMA.replace("\"llama\"", "\"qwen2\"");
        assert!(parse_config(json.as_bytes(), None, "c").unwrap().qkv_bias);
    }

    #[test]
    fn bad_configs_name_the_problem() {
        for (json, needle) in [
            ("{", "invalid JSON"),
            ("[]", "invalid JSON"),
            (r#"{"vocab_size": 1}"#, "`model_type`"),
            (r#"{"model_type": "bert"}"#, "model_type `bert`"),
            (r#"{"model_type": "llama"}"#, "`hidden_size`"),
            (r#"{"model_type": "gpt2", "n_embd": 64}"#, "`n_head`"),
            (
                r#"{"model_type": "llama", "hidden_size": "64"}"#,
                "invalid JSON",
            ),
            (
                r#"{"model_type": "llama", "hidden_size": -1}"#,
                "invalid JSON",
            ),
        ] {
            let err = parse_config(json.as_bytes(), None, "config.json")
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{json}: {err}");
        }
        // llama3 without its fields, and a kind not supported: refused naming rope_scaling
        for scaling in [
            r#"{"rope_type": "llama3"}"#,
            r#"{"rope_type": "yarn", "beta_fast": 32}"#,
            r#"{"rope_type": "dynamic", "factor": 4}"#,
        ] {
            let scaled = LLAMA.replace(
                "\"hidden_act\"",
                &format!("\"rope_scaling\": {scaling}, \"hidden_act\""),
            );
            let err = parse_config(scaled.as_bytes(), None, "c").unwrap_err();
            assert!(err.to_string().contains("rope_scaling"), "{err}");
        }
        let llama3 = r#"{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}"#;
        for (scaling, want) in [
            (
                llama3,
                RopeScaling::Llama3 {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_context: 64,
                },
            ),
            (
                r#"{"type": "linear", "factor": 2.0}"#,
                RopeScaling::Linear { factor: 2.0 },
            ),
            // Qwen's form: the defaults fill in, the original context is the model's
            (
                r#"{"type": "yarn", "factor": 4.0}"#,
                RopeScaling::Yarn {
                    factor: 4.0,
                    original_context: 128,
                    beta_fast: 32.0,
                    beta_slow: 1.0,
                    attention_factor: (0.1 * 4f64.ln() + 1.0) as f32,
                },
            ),
            (
                r#"{"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "beta_fast": 16, "beta_slow": 2, "attention_factor": 1.5}"#,
                RopeScaling::Yarn {
                    factor: 8.0,
                    original_context: 32,
                    beta_fast: 16.0,
                    beta_slow: 2.0,
                    attention_factor: 1.5,
                },
            ),
        ] {
            let scaled = LLAMA.replace(
                "\"hidden_act\"",
                &format!("\"rope_scaling\": {scaling}, \"hidden_act\""),
            );
            let c = parse_config(scaled.as_bytes(), None, "c").unwrap();
            assert_eq!(c.rope_scaling, want);
        }
        let gqa = LLAMA.replace("\"num_key_value_heads\":2", "\"num_key_value_heads\":3");
        let err = parse_config(gqa.as_bytes(), None, "c").unwrap_err();
        assert!(err.to_string().contains("n_kv_heads"), "{err}");
    }
}
