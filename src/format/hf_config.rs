//! Hugging Face `config.json` (and `generation_config.json`) to [`ModelConfig`]: the
//! architecture its `model_type` names reads the fields ([`crate::model::arch`]); the special
//! tokens and the checks are common. Also the pooling a sentence-transformers folder's
//! `1_Pooling/config.json` names.

use serde::Deserialize;

use crate::config::{ModelConfig, Pooling};
use crate::error::{Error, Result};
use crate::model::arch::{self, hf::OneOrMany, HfConfig};

#[derive(Debug, Deserialize)]
struct RawGenerationConfig {
    bos_token_id: Option<OneOrMany>,
    eos_token_id: Option<OneOrMany>,
}

fn parse_json<'de, T: Deserialize<'de>>(bytes: &'de [u8], file: &str) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::format(file, format!("invalid JSON: {e}")))
}

/// Parses `config.json` (named `file` in errors) and, when given, `generation_config.json`,
/// whose BOS/EOS ids take precedence (it is what generation uses).
pub fn parse_config(
    config_json: &[u8],
    generation_config_json: Option<&[u8]>,
    file: &str,
) -> Result<ModelConfig> {
    let raw: HfConfig = parse_json(config_json, file)?;
    let model_type = raw
        .model_type
        .as_deref()
        .ok_or_else(|| Error::format(file, "missing required field `model_type`"))?;
    let spec = arch::by_hf_model_type(model_type).ok_or_else(|| Error::Unsupported {
        file: file.to_string(),
        what: format!(
            "model_type `{model_type}` (supported: {})",
            arch::hf_model_types()
        ),
    })?;
    let mut config = (spec.hf_config)(&raw, file)?;
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
    arch::validate(&config, file)?;
    Ok(config)
}

/// The pooling a sentence-transformers `1_Pooling/config.json` names (`pooling_mode_*`
/// flags): mean, the CLS token or the last token; `None` when it names none. Another mode
/// (max, mean over √length, weighted mean) is refused naming it, `file` naming the file.
pub fn sentence_pooling(json: &[u8], file: &str) -> Result<Option<Pooling>> {
    let raw: serde_json::Value = serde_json::from_slice(json)
        .map_err(|e| Error::format(file, format!("invalid JSON: {e}")))?;
    let on = |key: &str| raw.get(key).and_then(serde_json::Value::as_bool) == Some(true);
    for other in [
        "pooling_mode_max_tokens",
        "pooling_mode_mean_sqrt_len_tokens",
        "pooling_mode_weightedmean_tokens",
    ] {
        if on(other) {
            return Err(Error::Unsupported {
                file: file.to_string(),
                what: format!("`{other}` (emberlm pools by mean, the CLS token or the last token)"),
            });
        }
    }
    let named: Vec<Pooling> = [
        ("pooling_mode_mean_tokens", Pooling::Mean),
        ("pooling_mode_cls_token", Pooling::Cls),
        ("pooling_mode_lasttoken", Pooling::Last),
    ]
    .into_iter()
    .filter(|(key, _)| on(key))
    .map(|(_, p)| p)
    .collect();
    match named[..] {
        [] => Ok(None),
        [one] => Ok(Some(one)),
        _ => Err(Error::Unsupported {
            file: file.to_string(),
            what: "several pooling modes at once (their vectors concatenated)".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{RopeLayout, RopeScaling};

    const LLAMA: &str = r#"{"model_type":"llama","vocab_size":512,"hidden_size":64,
        "intermediate_size":160,"num_hidden_layers":2,"num_attention_heads":4,
        "num_key_value_heads":2,"max_position_embeddings":128,"rms_norm_eps":1e-5,
        "rope_theta":10000.0,"hidden_act":"silu","tie_word_embeddings":false,
        "bos_token_id":0,"eos_token_id":[0, 7]}"#;

    #[test]
    fn llama_config_is_normalised() {
        let c = parse_config(LLAMA.as_bytes(), None, "config.json").unwrap();
        assert_eq!(c.arch, crate::model::arch::llama::ARCH);
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
    fn sentence_transformers_name_their_pooling() {
        let p = |json: &str| sentence_pooling(json.as_bytes(), "1_Pooling/config.json");
        assert_eq!(
            p(r#"{"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": false}"#).unwrap(),
            Some(Pooling::Mean)
        );
        assert_eq!(
            p(r#"{"pooling_mode_cls_token": true}"#).unwrap(),
            Some(Pooling::Cls)
        );
        assert_eq!(
            p(r#"{"pooling_mode_lasttoken": true}"#).unwrap(),
            Some(Pooling::Last)
        );
        assert_eq!(p("{}").unwrap(), None);
        for (json, needle) in [
            (
                r#"{"pooling_mode_max_tokens": true}"#,
                "pooling_mode_max_tokens",
            ),
            (
                r#"{"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true}"#,
                "several pooling modes",
            ),
            ("[", "invalid JSON"),
        ] {
            let e = p(json).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("1_Pooling"), "{json}: {e}");
        }
    }

    #[test]
    fn bad_configs_name_the_problem() {
        for (json, needle) in [
            ("{", "invalid JSON"),
            ("[]", "invalid JSON"),
            (r#"{"vocab_size": 1}"#, "`model_type`"),
            (r#"{"model_type": "t5"}"#, "model_type `t5`"),
            (r#"{"model_type": "bert"}"#, "`hidden_size`"),
            (
                r#"{"model_type": "bert", "hidden_act": "relu"}"#,
                "hidden_act `relu`",
            ),
            (
                r#"{"model_type": "bert", "position_embedding_type": "relative_key"}"#,
                "position_embedding_type `relative_key`",
            ),
            (
                r#"{"model_type": "bert", "type_vocab_size": 1}"#,
                "type_vocab_size 1",
            ),
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
