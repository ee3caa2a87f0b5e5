//! `Engine`: the JavaScript face of [`crate::engine::Engine`]. It converts arguments, events
//! and results between JS and Rust and hands the engine's futures to JavaScript as promises;
//! the queue, cancellation and device-loss recovery are the engine's own.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::Promise;
use wasm_bindgen::prelude::*;

use super::before_download::{self, RunsOn};
use super::blob_source::BlobSource;
use super::calls::{emitter, generation_js, on_token_function, parse_call, present};
use super::handle::Engine;
use super::http_source::HttpSource;
use super::source::{self, Source};
use super::stream;
use super::types::{EngineCounters, EngineInfo, SourceNote};
use super::{check_alive, install_panic_hook, js_error, js_message, spawn_promise, to_js};
use crate::backend::gpu::{DeviceChoice, GpuContext};
use crate::engine;
use crate::format::gguf_model::must_read_whole;
use crate::format::gguf_ranged::RangedGguf;
use crate::loader::ModelFiles;
use crate::session::Prompt;
use crate::Error;

pub(super) fn load_option(options: &JsValue, key: &str) -> JsValue {
    if options.is_undefined() || options.is_null() {
        return JsValue::UNDEFINED;
    }
    js_sys::Reflect::get(options, &JsValue::from_str(key)).unwrap_or(JsValue::UNDEFINED)
}

impl Engine {
    /// `Engine.load` as a Rust future (what the exported `load` runs; also used by tests).
    pub async fn open(source: JsValue, options: JsValue) -> Result<Engine, JsValue> {
        install_panic_hook();
        // every option read once, checked by name, and validated into the engine's options
        let page = super::load::read(&options).map_err(|e| js_error(&e))?;
        let options = page.options.resolve().map_err(|e| js_error(&e))?;
        let store = page.store().await.map_err(|e| js_error(&e))?;
        let digests = page.digests().map_err(|e| js_error(&e))?;
        let name = page.options.text("name").map(String::from);
        let (draft, on_progress) = (page.draft, page.on_progress);
        let gpu_options = options.gpu.clone();
        let source = Source::from_js(&source).map_err(|e| js_error(&e))?;
        let report = |phase: &str, loaded: u64, total: u64| {
            if let Some(f) = &on_progress {
                let event = js_sys::Object::new();
                super::set(&event, "phase", &JsValue::from_str(phase));
                super::set(&event, "loaded", &JsValue::from_f64(loaded as f64));
                super::set(&event, "total", &JsValue::from_f64(total as f64));
                // A throwing progress callback does not stop the load.
                let _ = f.call1(&JsValue::UNDEFINED, &event);
            }
        };

        // The device first: without a backend there is no point downloading the model.
        let (gpu, notice) = match gpu_options.device {
            DeviceChoice::Cpu => (None, None),
            DeviceChoice::Gpu => (
                Some(
                    GpuContext::new(gpu_options.clone())
                        .await
                        .map_err(|e| js_error(&e))?,
                ),
                None,
            ),
            DeviceChoice::Auto => match GpuContext::new(gpu_options.clone()).await {
                Ok(gpu) => (Some(gpu), None),
                Err(e @ (Error::NoAdapter(_) | Error::RequestDevice { .. })) => (
                    None,
                    Some(format!("no usable WebGPU ({e}); running on the CPU")),
                ),
                Err(e) => return Err(js_error(&e)),
            },
        };
        // A model that goes straight to the GPU is read a layer at a time where its files are
        // Blobs (a File, a download the store holds whole): the page never holds them.
        let straight_to_gpu = gpu.as_ref().is_some_and(|g| {
            gpu_options.device == DeviceChoice::Gpu
                || engine::Engine::runs_on_the_adapter(g, &options)
        });
        // The CPU backend reads them so too, each matrix its own as it arrives (in tiles where
        // the module multiplies in tiles). Only `auto` on a software adapter, which times both
        // backends on the model, reads the files whole.
        let by_range = straight_to_gpu || gpu.is_none();
        // Files the store holds whole (or the page's own Files) are read from there a range at
        // a time on the GPU (where a digest is to be checked, once the store has checked it);
        // files still on a server have their headers read first, by range, so that a model
        // that cannot run here is refused before its bytes are downloaded.
        let held = source
            .as_blobs(name.as_deref(), store.as_ref())
            .await
            .map_err(|e| js_error(&e))?;
        let stored_whole = held.is_some();
        let mut blobs = held.filter(|_| by_range && digests.is_none());
        let on_server = match (stored_whole, source.urls()) {
            (false, Some(urls)) => {
                let urls = HttpSource::named(&urls, name.as_deref());
                let runs_on = match (&gpu, straight_to_gpu) {
                    (Some(g), true) => RunsOn::Gpu(g),
                    (None, _) => RunsOn::Cpu,
                    (Some(_), false) => RunsOn::Either,
                };
                before_download::read_headers(&urls, runs_on, &options)
                    .await
                    .map_err(|e| js_error(&e))?
            }
            _ => None,
        };
        // A URL's first visit goes into the private file system store first, the page holding
        // one part at a time, and is read back from there.
        let mut stored_first = None;
        if by_range && blobs.is_none() {
            stored_first = source
                .store_first(store.as_ref(), digests.as_deref(), &mut |l, t| {
                    report("download", l, t)
                })
                .await
                .map_err(|e| js_error(&e))?;
            if stored_first.is_some() {
                // every file's digest was checked as it was stored (or read back)
                blobs = source
                    .as_blobs(name.as_deref(), store.as_ref())
                    .await
                    .map_err(|e| js_error(&e))?;
            }
        }
        // Without a store (and without digests to check over the whole file), a WebGPU load
        // reads the server's files a few layers at a time.
        let from_server = match on_server {
            Some(found) if by_range && blobs.is_none() && store.is_none() && digests.is_none() => {
                Some(found)
            }
            _ => None,
        };
        let ranged = match (blobs, from_server) {
            (Some(blobs), _) => {
                report("parse", 0, 1);
                let blobs = BlobSource::new(blobs);
                let names = blobs.names();
                match RangedGguf::open(Rc::new(blobs), &names).await {
                    Ok(r) => Some((r, None)),
                    // a file the loader must split as a whole: read whole below
                    Err(e) if must_read_whole(&e) => None,
                    Err(e) => return Err(js_error(&e)),
                }
            }
            (None, Some((http, ranged))) => Some((ranged, Some(http))),
            (None, None) => None,
        };
        let mut from_http = None;
        let (files, model_name, mut note) = match ranged {
            Some((r, http)) => {
                let files = ModelFiles::Ranged(Box::new(r));
                report("parse", 1, 1);
                let fetched = stored_first.as_ref();
                let note = SourceNote {
                    loaded_from_cache: source.is_url()
                        && http.is_none()
                        && fetched.is_none_or(|f| f.from_store),
                    stored_in_cache: fetched.is_some_and(|f| !f.from_store),
                    storage: store.as_ref().map(|s| s.medium().js_name().to_string()),
                    bytes_downloaded: fetched.map_or(0, |f| f.downloaded),
                    persisted: fetched.and_then(|f| f.persisted),
                    storage_notice: None,
                    read_by_range: true,
                };
                from_http = http;
                let model_name = name.unwrap_or_else(|| files.name().to_string());
                (files, model_name, note)
            }
            None => {
                let named = name.is_some();
                let fetched = source
                    .read(name, store.as_ref(), digests.as_deref(), &mut |l, t| {
                        report("download", l, t)
                    })
                    .await
                    .map_err(|e| js_error(&e))?;
                let (files, to_cache) = source::into_files(fetched.parts);
                report("parse", 0, 1);
                let files = ModelFiles::from_parts(files).map_err(|e| js_error(&e))?;
                report("parse", 1, 1);
                let cached = source::put_in_cache(to_cache, &files).await;
                // the caller's name, else the first part's (a split set's files in any order)
                let model_name = if named {
                    fetched.name
                } else {
                    files.name().to_string()
                };
                // a file stored first and then read whole (a matrix split on load) came from
                // the network all the same
                let first = stored_first.as_ref().filter(|f| !f.from_store);
                let note = SourceNote {
                    loaded_from_cache: fetched.from_cache && first.is_none(),
                    stored_in_cache: (fetched.stored && cached.is_ok() && !fetched.from_cache)
                        || first.is_some(),
                    storage: store.as_ref().map(|s| s.medium().js_name().to_string()),
                    bytes_downloaded: fetched.downloaded + first.map_or(0, |f| f.downloaded),
                    persisted: fetched.persisted.or(first.and_then(|f| f.persisted)),
                    storage_notice: fetched.store_error.clone().or(cached.err()),
                    read_by_range: false,
                };
                (files, model_name, note)
            }
        };
        let weight_bytes = files.weight_bytes().map_err(|e| js_error(&e))?;
        let auto = options.gpu.device == DeviceChoice::Auto;
        let inner = match gpu {
            Some(gpu) if auto => {
                engine::Engine::load_auto(gpu, files, options, &mut |l, t| report("upload", l, t))
                    .await
            }
            Some(gpu) => {
                engine::Engine::new(gpu, files, options, &mut |l, t| report("upload", l, t)).await
            }
            None => {
                engine::Engine::new_cpu(files, options, notice, &mut |l, t| report("load", l, t))
                    .await
            }
        }
        .map_err(|e| js_error(&e))?;
        if let Some(http) = from_http {
            // the headers' and the tensors' reads from the server
            note.bytes_downloaded = http.received();
        }
        let info = inner
            .inspect(|s| {
                EngineInfo::new(s, &model_name, weight_bytes, note)
                    .with_backend(inner.backend_notice(), inner.backend_choice())
            })
            .ok_or_else(|| js_message("Internal", "the engine lost its model while loading"))?;
        let info = Rc::new(RefCell::new(info));
        let refresh = Rc::clone(&info);
        inner.on_rebuild(move |session| {
            let rebuilt = refresh.borrow().rebuilt(session);
            *refresh.borrow_mut() = rebuilt;
        });
        if present(&draft) {
            super::draft::load_into(&inner, &info, draft, &JsValue::UNDEFINED).await?;
        }
        Ok(Engine {
            inner: Rc::new(inner),
            info,
        })
    }
}

#[wasm_bindgen]
impl Engine {
    /// Loads a GGUF model: fetches, reads or takes its bytes, parses it and uploads it to the
    /// GPU, or keeps it in memory for the CPU backend (`backend: 'cpu'`, and `'auto'` where
    /// the browser has no usable WebGPU). Rejects with an Error whose message starts with the
    /// failure's kind: `NoAdapter` (`backend: 'gpu'` without WebGPU), `Limit` (the model exceeds this GPU's limits; `needed`/`allowed` give the
    /// numbers), `Format`/`Unsupported` (a malformed or unsupported file), `Io` (download).
    #[wasm_bindgen(unchecked_return_type = "Promise<Engine>")]
    pub fn load(
        #[wasm_bindgen(unchecked_param_type = "ModelSource")] source: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "LoadOptions")] options: JsValue,
    ) -> Promise {
        spawn_promise(async move { Engine::open(source, options).await.map(JsValue::from) })
    }

    /// The adapter, its limits, the model and the context length.
    #[wasm_bindgen(unchecked_return_type = "EngineInfo")]
    pub fn info(&self) -> Result<JsValue, JsValue> {
        check_alive()?;
        to_js(&*self.info.borrow())
    }

    /// Generates from `prompt`; `onToken` sees every token as it is produced (and a last
    /// event with `id: null` for text held back at the end). A call made while another runs
    /// waits its turn; calls never interleave. Rejects when an option is invalid (the message
    /// names it), when `onToken` throws (the generation stops), on device loss (message
    /// starting with `DeviceLost`; retry) and after a panic.
    #[wasm_bindgen(unchecked_return_type = "Promise<GenerationResult>")]
    pub fn generate(
        &self,
        #[wasm_bindgen(unchecked_param_type = "Prompt")] prompt: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "GenerateOptions")] options: JsValue,
        #[wasm_bindgen(
            js_name = onToken,
            unchecked_optional_param_type = "(event: TokenEvent) => void"
        )]
        on_token: JsValue,
    ) -> Promise {
        let parsed = parse_call(&prompt, &options);
        let on_token = on_token_function(on_token);
        let inner = Rc::clone(&self.inner);
        spawn_promise(async move {
            let (prompt, options) = parsed?;
            let on_token = on_token?;
            let mut failure: Option<JsValue> = None;
            let mut emit = emitter(on_token.as_ref(), &inner, &mut failure);
            let g = inner
                .generate(&prompt, &options, &mut emit)
                .await
                .map_err(|e| js_error(&e))?;
            drop(emit);
            match failure {
                Some(err) => Err(err),
                None => generation_js(&g),
            }
        })
    }

    /// Generates from `prompt` as an async iterator of token events, whose return value is the
    /// GenerationResult; leaving the loop early aborts the generation. Queued like `generate`.
    #[wasm_bindgen(unchecked_return_type = "TokenStream")]
    pub fn stream(
        &self,
        #[wasm_bindgen(unchecked_param_type = "Prompt")] prompt: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "GenerateOptions")] options: JsValue,
    ) -> JsValue {
        stream::start(Rc::clone(&self.inner), parse_call(&prompt, &options))
    }

    /// The OpenAI-style chat API: `engine.chat.completions.create({ messages, ... })`.
    #[wasm_bindgen(getter)]
    pub fn chat(&self) -> super::openai::Chat {
        super::openai::Chat::new(Rc::clone(&self.inner))
    }

    /// The OpenAI-style plain completions: `engine.completions.create({ prompt, ... })`.
    #[wasm_bindgen(getter)]
    pub fn completions(&self) -> super::openai::Completions {
        super::openai::Completions::text(Rc::clone(&self.inner))
    }

    /// Stops the running call between two tokens; it resolves with `finishReason: "abort"`.
    pub fn abort(&self) {
        self.inner.abort();
    }

    /// Forgets the conversation (in its turn, after calls already queued): the next call starts
    /// from an empty KV cache.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn reset(&self) -> Promise {
        let inner = Rc::clone(&self.inner);
        spawn_promise(async move {
            inner.reset().await.map_err(|e| js_error(&e))?;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// The token ids of `text` under the model's tokenizer (in its turn, after calls already
    /// queued), as a `number[]` prompt would give them to `generate`. Options: `special`
    /// (recognise special tokens written in the text, default false) and `addBos` (default:
    /// what the tokenizer asks for). Rejects when an option is invalid (the message names it).
    #[wasm_bindgen(unchecked_return_type = "Promise<number[]>")]
    pub fn tokenize(
        &self,
        text: String,
        #[wasm_bindgen(unchecked_optional_param_type = "TokenizeOptions")] options: JsValue,
    ) -> Promise {
        let flag = |key: &'static str| -> Result<Option<bool>, JsValue> {
            let v = load_option(&options, key);
            if !present(&v) {
                return Ok(None);
            }
            v.as_bool()
                .map(Some)
                .ok_or_else(|| js_error(&Error::invalid(key, "must be a boolean")))
        };
        let flags = flag("special").and_then(|special| Ok((special, flag("addBos")?)));
        let inner = Rc::clone(&self.inner);
        spawn_promise(async move {
            let (special, add_bos) = flags?;
            let ids = inner
                .with_session(|s| {
                    s.tokenizer()
                        .encode(&text, special.unwrap_or(false), add_bos)
                })
                .await
                .map_err(|e| js_error(&e))?;
            to_js(&ids)
        })
    }

    /// Mean negative log-likelihood and perplexity of `text` (tokenized as a text prompt, BOS
    /// as the model asks), window by window of the context, in its turn: `{ tokens, nll, ppl }`
    /// (`tokens` predicted, `nll` in nats per token). The conversation is forgotten (scoring
    /// overwrites the KV cache). Rejects a text of fewer than 2 tokens.
    #[wasm_bindgen(unchecked_return_type = "Promise<PerplexityResult>")]
    pub fn perplexity(&self, text: String) -> Promise {
        let inner = Rc::clone(&self.inner);
        spawn_promise(async move {
            let prompt = Prompt::Text(text);
            let tokens = inner
                .with_session(|s| s.tokenize_prompt(&prompt, false))
                .await
                .map_err(|e| js_error(&e))?;
            let score = inner.score(&tokens).await.map_err(|e| js_error(&e))?;
            to_js(&score)
        })
    }

    /// The GPU work counters (dispatches, submits, readbacks, buffers, weight bytes bound,
    /// forward steps) as totals since the device was created, with the GPU memory the model
    /// holds; taken in its turn, after calls already queued. Subtract two snapshots to get
    /// what one call did.
    #[wasm_bindgen(unchecked_return_type = "Promise<EngineCounters>")]
    pub fn counters(&self) -> Promise {
        let inner = Rc::clone(&self.inner);
        spawn_promise(async move {
            let counters = inner
                .with_session(|s| Ok(EngineCounters::new(s)))
                .await
                .map_err(|e| js_error(&e))?;
            to_js(&counters)
        })
    }

    /// Times every kernel of one decode step (at position `decodePos`, default 32) and one
    /// prefill chunk (`promptTokens` tokens, default 32, at most 64) under the kernel plan, in
    /// its turn. The conversation is forgotten (the profile overwrites the KV cache).
    #[wasm_bindgen(unchecked_return_type = "Promise<KernelProfile>")]
    pub fn profile(
        &self,
        #[wasm_bindgen(unchecked_optional_param_type = "ProfileOptions")] options: JsValue,
    ) -> Promise {
        let number = |key: &'static str, default: u32| -> Result<u32, JsValue> {
            let v = load_option(&options, key);
            if !present(&v) {
                return Ok(default);
            }
            v.as_f64()
                .filter(|n| n.fract() == 0.0 && *n >= 0.0 && *n <= f64::from(u32::MAX))
                .map(|n| n as u32)
                .ok_or_else(|| js_error(&Error::invalid(key, "must be a whole number >= 0")))
        };
        let args = number("decodePos", 32).and_then(|d| Ok((d, number("promptTokens", 32)?)));
        let inner = Rc::clone(&self.inner);
        spawn_promise(async move {
            let (decode_pos, prompt_tokens) = args?;
            let profile = inner
                .profile(decode_pos, prompt_tokens)
                .await
                .map_err(|e| js_error(&e))?;
            to_js(&profile)
        })
    }

    /// Destroys the GPU device (in its turn) as a driver reset would, to test device-loss
    /// handling: the next call rejects with `DeviceLost`, the one after it works again.
    #[wasm_bindgen(js_name = destroyDeviceForTest, unchecked_return_type = "Promise<void>")]
    pub fn destroy_device_for_test(&self) -> Promise {
        let inner = Rc::clone(&self.inner);
        spawn_promise(async move {
            inner.destroy_device_for_test().await;
            Ok(JsValue::UNDEFINED)
        })
    }
}
