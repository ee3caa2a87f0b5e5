//! Embeddings ([`Session::embed`]): each text's final hidden states (after the model's last
//! norm, the LM head never runs) pooled into one vector, on whichever backend runs the model.
//! The conversation the KV cache held is kept: its rows are copied out before and written
//! back after, so the next call continues it without a forward pass.

use serde_json::Value;

use super::Session;
use crate::backend::{Output, Readback, Rows};
pub use crate::config::Pooling;
use crate::error::{Error, Result};

/// What [`Session::embed`] does with each text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct EmbedOptions {
    /// How token states are pooled; `None`: the model's own where its file names one (BERT's
    /// `pooling_type`), else mean.
    pub pooling: Option<Pooling>,
    /// Scales every vector to unit length (cosine similarity is then a dot product).
    pub normalize: bool,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        Self {
            pooling: None,
            normalize: true,
        }
    }
}

/// The keys [`EmbedOptions::from_json`] reads.
const KEYS: [&str; 2] = ["pooling", "normalize"];

impl EmbedOptions {
    /// Options from a JSON object (`{"pooling": "last", "normalize": false}`; `null` or a
    /// missing key is the default). A key that is not one of them, or of the wrong type, is
    /// refused naming it.
    pub fn from_json(value: &Value) -> Result<Self> {
        let mut options = Self::default();
        let object = match value {
            Value::Null => return Ok(options),
            Value::Object(o) => o,
            other => {
                return Err(Error::invalid(
                    "options",
                    format!("embedding options are an object, not {other}"),
                ))
            }
        };
        for (key, v) in object {
            match (key.as_str(), v) {
                (_, Value::Null) if KEYS.contains(&key.as_str()) => {}
                ("pooling", Value::String(s)) => options.pooling = Some(Pooling::parse(s)?),
                ("normalize", Value::Bool(b)) => options.normalize = *b,
                ("pooling", _) => {
                    return Err(Error::invalid(
                        "pooling",
                        format!("is a string (mean, last or cls), not {v}"),
                    ))
                }
                ("normalize", _) => {
                    return Err(Error::invalid(
                        "normalize",
                        format!("is true or false, not {v}"),
                    ))
                }
                _ => {
                    return Err(Error::invalid(
                        "options",
                        format!(
                            "`{key}` is not an embedding option (they are {})",
                            KEYS.join(", ")
                        ),
                    ))
                }
            }
        }
        Ok(options)
    }
}

/// What [`Session::embed`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    /// One vector per text, `[texts][d]`.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens each text was read as.
    pub tokens: Vec<usize>,
}

/// `v` scaled to unit length (left alone when it is all zeros).
pub fn normalized(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        for x in &mut v {
            *x = (f64::from(*x) / norm) as f32;
        }
    }
    v
}

impl Session {
    /// The pooling `options` ask for, else the model's own (BERT files name one), else mean.
    pub fn pooling(&self, options: &EmbedOptions) -> Pooling {
        options
            .pooling
            .or(self.config().pooling)
            .unwrap_or_default()
    }

    /// Each of `texts` embedded: tokenized as a whole input (the tokenizer's special tokens
    /// added, BERT's `[CLS] text [SEP]`, none recognised in the text), run from an empty cache with
    /// [`Readback::Hidden`], pooled and, with `normalize`, scaled to unit length; `[texts][d]`.
    ///
    /// The conversation the cache held is copied out first and written back after, so the
    /// next call continues it with no forward pass. A text that reads as no tokens, or as
    /// more than the context holds, is refused naming its index; so is an empty list.
    pub async fn embed(&mut self, texts: &[String], options: &EmbedOptions) -> Result<Embeddings> {
        if texts.is_empty() {
            return Err(Error::invalid("input", "there is no text to embed"));
        }
        let mut ids = Vec::with_capacity(texts.len());
        for (i, text) in texts.iter().enumerate() {
            let tokens = self.tokenizer.encode_whole(text)?;
            if tokens.is_empty() {
                return Err(Error::invalid(
                    "input",
                    format!("text {i} reads as no tokens: there is nothing to embed"),
                ));
            }
            if tokens.len() > self.context() {
                return Err(Error::invalid(
                    "input",
                    format!(
                        "text {i} is {} tokens, more than the context of {}",
                        tokens.len(),
                        self.context()
                    ),
                ));
            }
            super::check_token_ids("input", &tokens, self.vocab())?;
            ids.push(tokens);
        }
        let kept = match self.cached.is_empty() {
            true => None,
            false => Some(self.save_state(None).await?),
        };
        let result = self.embed_ids(&ids, options).await;
        self.reset();
        if let Some(bytes) = kept {
            let restored = self
                .restore_state(&bytes, "the conversation kept while embedding")
                .await;
            if let Err(e) = restored {
                // the cache is empty and says so: the next call recomputes its prompt
                self.reset();
                if result.is_ok() {
                    return Err(e);
                }
            }
        }
        result
    }

    async fn embed_ids(&mut self, ids: &[Vec<u32>], options: &EmbedOptions) -> Result<Embeddings> {
        let d = self.config().hidden_size;
        let pooling = self.pooling(options);
        let mut vectors = Vec::with_capacity(ids.len());
        for tokens in ids {
            self.reset();
            let states = match self
                .forward
                .run(Rows::Next(tokens), Readback::Hidden)
                .await?
            {
                Output::Hidden(states) if states.len() == tokens.len() * d => states,
                other => {
                    return Err(Error::invalid(
                        "backend",
                        format!(
                            "hidden states of {} tokens were asked for, {} came back",
                            tokens.len(),
                            match other {
                                Output::Hidden(s) => format!("{} values", s.len()),
                                _ => "something else".into(),
                            }
                        ),
                    ))
                }
            };
            let pooled = pooling.pool(&states, d);
            vectors.push(match options.normalize {
                true => normalized(pooled),
                false => pooled,
            });
        }
        Ok(Embeddings {
            vectors,
            tokens: ids.iter().map(Vec::len).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_reads_the_rows_it_names() {
        let states = [1.0, 2.0, 3.0, 4.0, 5.0, 9.0];
        assert_eq!(Pooling::Mean.pool(&states, 2), vec![3.0, 5.0]);
        assert_eq!(Pooling::Last.pool(&states, 2), vec![5.0, 9.0]);
        assert_eq!(Pooling::Cls.pool(&states, 2), vec![1.0, 2.0]);
        assert_eq!(normalized(vec![3.0, 4.0]), vec![0.6, 0.8]);
        assert_eq!(normalized(vec![0.0, 0.0]), vec![0.0, 0.0]);
    }

    #[test]
    fn options_are_read_and_bad_ones_named() {
        let o =
            EmbedOptions::from_json(&serde_json::json!({"pooling": "LAST", "normalize": false}))
                .unwrap();
        assert_eq!((o.pooling, o.normalize), (Some(Pooling::Last), false));
        assert_eq!(
            EmbedOptions::from_json(&serde_json::json!({"pooling": null})).unwrap(),
            EmbedOptions::default()
        );
        for (bad, says) in [
            (
                serde_json::json!({"pooling": "max"}),
                "`max` is not a pooling",
            ),
            (serde_json::json!({"pooling": 1}), "pooling"),
            (serde_json::json!({"normalize": "yes"}), "true or false"),
            (
                serde_json::json!({"normalise": true}),
                "`normalise` is not an embedding option",
            ),
            (serde_json::json!([1]), "an object"),
        ] {
            let e = EmbedOptions::from_json(&bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
