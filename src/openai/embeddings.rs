//! The OpenAI `embeddings` endpoint over [`Session::embed`](crate::session::Session::embed):
//! the request ([`EmbeddingRequest`]) and the response's shape ([`embedding_response`]).
//!
//! Request fields: `input` (a string or an array of up to [`MAX_INPUTS`] strings), `model`,
//! `encoding_format` (`float`, the default, or `base64`: each vector's little-endian f32 bytes),
//! `dimensions` (accepted only as the model's width: a model not trained for shorter vectors
//! loses meaning when cut), `user`, and two of emberlm's: `pooling` (`mean`, `last` or `cls`;
//! by default the model's own where its file names one, else `mean`) and `normalize` (default true: unit vectors, as OpenAI's are). Anything
//! else is an error naming the field; so is an array of token ids (send the text).

use serde_json::{json, Map, Value};

use crate::session::{EmbedOptions, Embeddings};
use crate::{Error, Result};

/// Most texts one request may embed (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// A parsed `embeddings` request.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingRequest {
    /// The `model` field as sent (echoed in the response), if any.
    pub model: Option<String>,
    /// The texts, `[inputs]`.
    pub input: Vec<String>,
    /// `encoding_format: "base64"`.
    pub base64: bool,
    /// `dimensions`, when given.
    pub dimensions: Option<usize>,
    /// Pooling and normalisation.
    pub options: EmbedOptions,
}

fn bad(message: impl Into<String>) -> Error {
    Error::invalid("request", message)
}

const FIELDS: [&str; 7] = [
    "input",
    "model",
    "encoding_format",
    "dimensions",
    "user",
    "pooling",
    "normalize",
];

impl EmbeddingRequest {
    /// Parses a request body, naming the field that is wrong.
    pub fn from_json(body: &str) -> Result<Self> {
        let value: Value =
            serde_json::from_str(body).map_err(|e| bad(format!("the body is not JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Err(bad("the body is a JSON object"));
        };
        if let Some(unknown) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(bad(format!(
                "unknown field `{unknown}` (an embeddings request takes {})",
                FIELDS.join(", ")
            )));
        }
        let input = inputs(map.get("input"))?;
        let model = match map.get("model") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => return Err(bad(format!("`model` is a string, not {other}"))),
        };
        let base64 = match map.get("encoding_format") {
            None | Some(Value::Null) => false,
            Some(Value::String(s)) if s == "float" => false,
            Some(Value::String(s)) if s == "base64" => true,
            Some(other) => {
                return Err(bad(format!(
                    "`encoding_format` is \"float\" or \"base64\", not {other}"
                )))
            }
        };
        let dimensions = match map.get("dimensions") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) if n > 0 => Some(n),
                _ => return Err(bad(format!("`dimensions` is a positive integer, not {v}"))),
            },
        };
        if let Some(user) = map.get("user").filter(|u| !u.is_null() && !u.is_string()) {
            return Err(bad(format!("`user` is a string, not {user}")));
        }
        let mut own = Map::new();
        for key in ["pooling", "normalize"] {
            if let Some(v) = map.get(key) {
                own.insert(key.into(), v.clone());
            }
        }
        let options = EmbedOptions::from_json(&Value::Object(own))?;
        Ok(Self {
            model,
            input,
            base64,
            dimensions,
            options,
        })
    }

    /// Refuses `dimensions` other than the model's width `d`.
    pub fn check_dimensions(&self, d: usize) -> Result<()> {
        match self.dimensions {
            Some(n) if n != d => Err(bad(format!(
                "`dimensions` {n} is not supported: this model's embeddings have {d} (it was not \
                 trained for shorter ones)"
            ))),
            _ => Ok(()),
        }
    }
}

fn inputs(input: Option<&Value>) -> Result<Vec<String>> {
    let texts = match input {
        None | Some(Value::Null) => return Err(bad("`input` is required")),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => Ok(s.clone()),
                Value::Number(_) | Value::Array(_) => Err(bad(format!(
                    "`input[{i}]`: token ids are not accepted; send the text"
                ))),
                other => Err(bad(format!("`input[{i}]` is a string, not {other}"))),
            })
            .collect::<Result<_>>()?,
        Some(other) => {
            return Err(bad(format!(
                "`input` is a string or an array of strings, not {other}"
            )))
        }
    };
    if texts.is_empty() {
        return Err(bad("`input` holds no text"));
    }
    if texts.len() > MAX_INPUTS {
        return Err(bad(format!(
            "`input` holds {} texts; at most {MAX_INPUTS} fit one request",
            texts.len()
        )));
    }
    if let Some(i) = texts.iter().position(String::is_empty) {
        return Err(bad(format!("`input[{i}]` is empty")));
    }
    Ok(texts)
}

/// The response body: a `list` of `embedding` objects in input order, the model's name and the
/// tokens read (`usage.prompt_tokens`, `usage.total_tokens`).
pub fn embedding_response(model: &str, embeddings: &Embeddings, base64: bool) -> Value {
    let data: Vec<Value> = embeddings
        .vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = match base64 {
                true => {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    Value::String(base64::encode(bytes))
                }
                false => json!(v),
            };
            json!({ "object": "embedding", "index": i, "embedding": embedding })
        })
        .collect();
    let tokens: usize = embeddings.tokens.iter().sum();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::Pooling;

    #[test]
    fn requests_are_read_and_bad_ones_named() {
        let r = EmbeddingRequest::from_json(
            r#"{"input": ["a", "b"], "model": "m", "encoding_format": "base64",
                "pooling": "last", "normalize": false, "user": "u", "dimensions": 64}"#,
        )
        .unwrap();
        assert_eq!(r.input, ["a", "b"]);
        assert!(r.base64);
        assert_eq!(
            (r.options.pooling, r.options.normalize),
            (Some(Pooling::Last), false)
        );
        assert!(r.check_dimensions(64).is_ok());
        let e = r.check_dimensions(576).unwrap_err().to_string();
        assert!(e.contains("`dimensions` 64 is not supported"), "{e}");
        let one = EmbeddingRequest::from_json(r#"{"input": "text"}"#).unwrap();
        assert_eq!((one.input.len(), one.base64), (1, false));
        assert_eq!(one.options, EmbedOptions::default());
        for (body, says) in [
            (r#"{}"#, "`input` is required"),
            (r#"{"input": []}"#, "holds no text"),
            (r#"{"input": [""]}"#, "`input[0]` is empty"),
            (r#"{"input": [1, 2]}"#, "token ids are not accepted"),
            (r#"{"input": [[1, 2]]}"#, "token ids are not accepted"),
            (
                r#"{"input": "a", "encoding_format": "int8"}"#,
                "\"float\" or \"base64\"",
            ),
            (r#"{"input": "a", "dimensions": 0}"#, "positive integer"),
            (r#"{"input": "a", "pooling": "max"}"#, "not a pooling"),
            (
                r#"{"input": "a", "temperature": 1}"#,
                "unknown field `temperature`",
            ),
            (r#"[1]"#, "a JSON object"),
            (r#"{"#, "not JSON"),
        ] {
            let e = EmbeddingRequest::from_json(body).unwrap_err().to_string();
            assert!(e.contains(says), "{body}: {e}");
        }
        let many = format!(r#"{{"input": {}}}"#, json!(vec!["x"; MAX_INPUTS + 1]));
        assert!(EmbeddingRequest::from_json(&many).is_err());
    }

    #[test]
    fn the_response_has_openais_shape() {
        let e = Embeddings {
            vectors: vec![vec![1.0, -2.0], vec![0.5, 0.25]],
            tokens: vec![3, 4],
        };
        let v = embedding_response("m", &e, false);
        assert_eq!(v["data"][1]["embedding"], json!([0.5, 0.25]));
        assert_eq!(v["data"][1]["index"], json!(1));
        assert_eq!(v["usage"]["prompt_tokens"], json!(7));
        let b = embedding_response("m", &e, true);
        let text = b["data"][0]["embedding"].as_str().unwrap();
        let bytes = base64::decode(text).unwrap();
        let back: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(back, [1.0, -2.0]);
    }
}
