//! `engine.embed(texts, options)` and `engine.embeddings.create(request)`: each text's final
//! hidden states pooled into one vector ([`crate::session::Session::embed`]), as
//! `Float32Array`s or in OpenAI's response shape ([`crate::openai::embeddings`]).

use std::rc::Rc;

use js_sys::{Array, Float32Array, Promise};
use wasm_bindgen::prelude::*;

use super::handle::Engine;
use super::{js_error, spawn_promise, to_js, to_json};
use crate::openai::embeddings::{embedding_response, EmbeddingRequest};
use crate::session::EmbedOptions;
use crate::Error;

/// `engine.embeddings`: `create(request)`.
#[wasm_bindgen]
pub struct Embeddings {
    engine: Rc<crate::engine::Engine>,
}

/// `texts` as a list of strings: one string, or an array of them.
fn texts_of(value: &JsValue) -> Result<Vec<String>, JsValue> {
    if let Some(text) = value.as_string() {
        return Ok(vec![text]);
    }
    if !Array::is_array(value) {
        return Err(js_error(&Error::invalid(
            "texts",
            "is a string or an array of strings",
        )));
    }
    Array::from(value)
        .iter()
        .enumerate()
        .map(|(i, item)| {
            item.as_string().ok_or_else(|| {
                js_error(&Error::invalid(
                    "texts",
                    format!("texts[{i}] is not a string"),
                ))
            })
        })
        .collect()
}

#[wasm_bindgen]
impl Engine {
    /// Embeds `texts` (a string or an array of strings) in its turn: one `Float32Array` of the
    /// model's width per text, its final hidden states pooled (`options.pooling`: `"mean"`,
    /// `"last"` or `"cls"`; by default the model's own where its file names one, else mean) and scaled to unit length unless
    /// `options.normalize` is false. The conversation is kept. Rejects, naming the problem,
    /// on an empty list, a text longer than the context or an unknown option.
    #[wasm_bindgen(unchecked_return_type = "Promise<Float32Array[]>")]
    pub fn embed(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string | string[]")] texts: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "EmbedOptions")] options: JsValue,
    ) -> Promise {
        let parsed = texts_of(&texts).and_then(|texts| {
            let json = to_json(&options, "options")?;
            let value: serde_json::Value = serde_json::from_str(&json)
                .map_err(|e| js_error(&Error::invalid("options", e.to_string())))?;
            let options = EmbedOptions::from_json(&value).map_err(|e| js_error(&e))?;
            Ok((texts, options))
        });
        let inner = Rc::clone(&self.inner);
        spawn_promise(async move {
            let (texts, options) = parsed?;
            let embeddings = inner
                .embed(&texts, &options)
                .await
                .map_err(|e| js_error(&e))?;
            let out = Array::new();
            for v in &embeddings.vectors {
                out.push(&Float32Array::from(v.as_slice()));
            }
            Ok(out.into())
        })
    }

    /// The OpenAI-style embeddings API: `engine.embeddings.create({ input, ... })`.
    #[wasm_bindgen(getter)]
    pub fn embeddings(&self) -> Embeddings {
        Embeddings {
            engine: Rc::clone(&self.inner),
        }
    }
}

#[wasm_bindgen]
impl Embeddings {
    /// Answers an OpenAI-style embeddings request (`input`, `model`, `encoding_format`,
    /// `dimensions`, `user`, and emberlm's `pooling` and `normalize`) with the response object
    /// (`data[i].embedding`). Rejects, naming the field, on an unknown or invalid one.
    #[wasm_bindgen(unchecked_return_type = "Promise<EmbeddingResponse>")]
    pub fn create(
        &self,
        #[wasm_bindgen(unchecked_param_type = "EmbeddingRequest")] request: JsValue,
    ) -> Promise {
        let parsed = to_json(&request, "request")
            .and_then(|text| EmbeddingRequest::from_json(&text).map_err(|e| js_error(&e)));
        let engine = Rc::clone(&self.engine);
        spawn_promise(async move {
            let request = parsed?;
            let embeddings = engine
                .embed(&request.input, &request.options)
                .await
                .map_err(|e| js_error(&e))?;
            let d = embeddings.vectors.first().map_or(0, Vec::len);
            request.check_dimensions(d).map_err(|e| js_error(&e))?;
            let name = request
                .model
                .clone()
                .unwrap_or_else(|| crate::openai::model_name(engine.files().name()));
            to_js(&embedding_response(&name, &embeddings, request.base64))
        })
    }
}
