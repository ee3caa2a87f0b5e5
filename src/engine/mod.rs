//! The engine: one model loaded on the GPU (or the CPU backend, asked for or where no GPU is
//! usable) behind a request queue, used alike by the
//! command-line tool (natively, driven by `pollster`) and by the browser (`web` converts its
//! calls from and to JavaScript).
//!
//! - **Queue.** Requests that use the model run one at a time, first come first served, and
//!   never interleave. The futures are `!Send` (one thread: the browser's, or the caller's);
//!   no `RefCell` borrow is held across an `.await`: a request takes the [`Session`] out of the
//!   engine for its duration and puts it back, so [`Engine::abort`] and [`Engine::inspect`] work
//!   while a request awaits the GPU or runs a token callback.
//! - **Cancellation.** [`Engine::abort`] (or an [`AbortSwitch`] held by another thread) stops
//!   the running request between two tokens; a [`Cancel`] stops one request, and a request
//!   still waiting in line is dropped with it (dropping its future works too).
//! - **Device loss.** The engine keeps the model's files, the options it was loaded with and the
//!   tokens of the conversation (what the KV cache held after the last request). A request that
//!   meets a lost device fails with [`Error::DeviceLost`]; the next request (or
//!   [`Engine::recover`]) creates a new device, uploads the model again and replays the
//!   conversation's tokens, so the KV cache holds the conversation as before the loss. A model
//!   on the CPU has no device to lose.

mod cancel;
mod choose;
mod draft;
pub mod load_keys;
mod load_options;
mod queue;
mod recovery;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::backend::gpu::{DeviceChoice, GpuContext, GpuOptions};
use crate::error::{Error, Result};
use crate::loader::ModelFiles;
use crate::session::{GenerateOptions, Generation, Prompt, Score, Session, TokenEvent};
use queue::{Queue, Turn};

pub use cancel::{AbortSwitch, Cancel};
pub use choose::{BackendChoice, Chosen};
pub use load_options::{LoadOptions, OptionValue, Surface};

/// How the engine loads its model, kept to load it again after device loss.
#[derive(Clone, Debug, Default)]
pub struct EngineOptions {
    /// KV cache length in positions (default: the model's context, at most 4096, within the
    /// device's limits).
    pub context: Option<usize>,
    /// The device to ask for (kernel variants forced, features, the KV-cache kinds).
    pub gpu: GpuOptions,
    /// Choose the KV-cache kind automatically (`kv_cache: "auto"`) under these settings;
    /// `None` keeps `gpu.kv_cache`.
    pub cache_plan: Option<crate::session::CachePlanOptions>,
    /// A Jinja chat template to use instead of the model's own (or of the plain fallback).
    pub chat_template: Option<String>,
    /// With a fixed KV-cache kind: the largest cache allowed, MiB (`cacheBudgetMb`); loading
    /// fails with the numbers when the context does not fit it.
    pub kv_budget_mb: Option<f64>,
    /// What the CPU backend multiplies quantized matrices with: 8-bit activations (default),
    /// or f32 where `precision: 'f32'` was asked for by name.
    pub cpu_precision: crate::backend::cpu::CpuPrecision,
}

impl EngineOptions {
    /// The KV-cache kinds a session starts in: those asked for, or f32 where the automatic
    /// plan chooses them once the model is loaded.
    pub fn starting_kinds(&self) -> crate::dtype::kv::KvKinds {
        match self.cache_plan {
            Some(_) => crate::dtype::kv::KvKinds::default(),
            None => self.gpu.kv_cache,
        }
    }
}

/// Called with the new session after every rebuild on a new device.
type RebuildHook = Box<dyn FnMut(&Session)>;

/// A model loaded on the GPU or the CPU, ready to generate: see the
/// [module documentation](self).
pub struct Engine {
    queue: Rc<Queue>,
    /// The model, kept to upload it again after device loss.
    files: ModelFiles,
    options: EngineOptions,
    /// `None` while a request uses it, and after device loss until the next rebuild.
    session: RefCell<Option<Session>>,
    /// The tokens the KV cache held after the last request: what a rebuild replays.
    conversation: RefCell<Vec<u32>>,
    abort: AbortSwitch,
    full_row_readback: Cell<bool>,
    closed: Cell<bool>,
    /// A request met a lost device; the next one rebuilds.
    lost: Cell<bool>,
    rebuilds: Cell<u64>,
    on_rebuild: RefCell<Option<RebuildHook>>,
    /// The KV-cache kinds the session was loaded with (the automatic plan's choice), which a
    /// rebuild on a new device keeps.
    session_kinds: Cell<Option<crate::dtype::kv::KvKinds>>,
    /// The draft model's files (speculative decoding), loaded again by a rebuild.
    draft: RefCell<Option<ModelFiles>>,
    /// Why the model runs where it runs, when that was not asked for (no usable GPU, or
    /// `auto`'s measured choice on a software adapter).
    backend_notice: Option<String>,
    /// `auto`'s measured choice on a software adapter.
    backend_choice: Option<BackendChoice>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.files.name())
            .field("options", &self.options)
            .field("conversation", &self.conversation.borrow().len())
            .field("rebuilds", &self.rebuilds.get())
            .field("closed", &self.closed.get())
            .finish()
    }
}

/// Holds a request's turn; marks its [`Cancel`] as no longer running when dropped.
struct Running<'a> {
    _turn: Turn,
    cancel: Option<&'a Cancel>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.cancel {
            c.set_running(false);
        }
    }
}

/// The error to report when `result` failed because the session's device is lost.
fn lost_error<T>(session: &Session, result: &Result<T>) -> Option<Error> {
    match result {
        Err(e @ Error::DeviceLost { .. }) => Some(e.clone()),
        Err(e) if session.gpu().is_some_and(GpuContext::is_lost) => Some(
            session
                .gpu()
                .and_then(|g| g.check().err())
                .unwrap_or(e.clone()),
        ),
        _ => None,
    }
}

/// The KV cache of `session` (its kinds at its context, local layers as the rings they keep)
/// fits `budget` MiB, or an error with the numbers naming `cacheBudgetMb`.
fn check_kv_budget(session: &Session, budget: f64) -> Result<()> {
    let config = session.config();
    let kinds = session.forward().kv_kinds();
    let context = session.context();
    let layout = crate::config::KvLayout::trained(config, context, session.forward().chunk());
    let row_bytes = kinds.row_bytes(config.kv_dim());
    let bytes = layout.sequence_bytes(row_bytes);
    let mib = bytes as f64 / f64::from(1u32 << 20);
    if mib > budget {
        let limit = (budget * f64::from(1u32 << 20)) as u64;
        let fits = layout.positions_within(row_bytes, limit);
        return Err(Error::invalid(
            "cacheBudgetMb",
            format!(
                "a {kinds} KV cache of {context} positions takes {mib:.2} MiB ({} bytes per \
                 position), over the budget of {budget} MiB; at most {fits} positions fit it (set \
                 contextLength), or choose a smaller kind",
                layout.position_bytes(row_bytes)
            ),
        ));
    }
    Ok(())
}

impl Engine {
    /// Loads `files` on the backend `options.gpu.device` asks for: a new GPU device on any
    /// adapter (`gpu`), the CPU (`cpu`), or (`auto`) a hardware adapter, the faster of a
    /// software adapter and the CPU ([`Engine::load_auto`]), the CPU where there is none.
    pub async fn load(files: ModelFiles, options: EngineOptions) -> Result<Self> {
        match options.gpu.device {
            DeviceChoice::Cpu => Self::new_cpu(files, options, None, &mut |_, _| {}).await,
            DeviceChoice::Gpu => {
                let gpu = GpuContext::new(options.gpu.clone()).await?;
                Self::new(gpu, files, options, &mut |_, _| {}).await
            }
            DeviceChoice::Auto => match GpuContext::new(options.gpu.clone()).await {
                Ok(gpu) => Self::load_auto(gpu, files, options, &mut |_, _| {}).await,
                Err(e @ (Error::NoAdapter(_) | Error::RequestDevice { .. })) => {
                    let notice = format!("no usable GPU ({e}); running on the CPU");
                    Self::new_cpu(files, options, Some(notice), &mut |_, _| {}).await
                }
                Err(e) => Err(e),
            },
        }
    }

    /// Loads `files` on the CPU backend; `notice` says why, when it was not asked for. Calls
    /// `progress(read, total)` in weight bytes as a model read by range comes in.
    pub async fn new_cpu(
        files: ModelFiles,
        options: EngineOptions,
        notice: Option<String>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let session = Session::new_cpu_read(
            &files,
            options.context,
            options.cpu_precision,
            options.starting_kinds(),
            progress,
        )
        .await?;
        Self::from_session(session, files, options, notice).await
    }

    /// Loads `files` on `gpu` (created with `options.gpu`), calling `progress(uploaded, total)`
    /// in weight bytes as the weights go to the GPU.
    pub async fn new(
        gpu: GpuContext,
        files: ModelFiles,
        options: EngineOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let session = Session::new_with_progress(gpu, &files, options.context, progress).await?;
        Self::from_session(session, files, options, None).await
    }

    async fn from_session(
        mut session: Session,
        files: ModelFiles,
        options: EngineOptions,
        notice: Option<String>,
    ) -> Result<Self> {
        if let Some(source) = &options.chat_template {
            session.set_chat_template(source)?;
        }
        match &options.cache_plan {
            Some(plan) => {
                session.plan_kv_cache(plan).await?;
            }
            // the kinds asked for (a GPU session was created with them; the CPU's starts f32)
            None if session.forward().kv_kinds() != options.gpu.kv_cache => {
                session.set_kv_kinds(options.gpu.kv_cache).await?;
            }
            None => {}
        }
        if let Some(budget) = options.kv_budget_mb {
            check_kv_budget(&session, budget)?;
        }
        let abort = AbortSwitch::default();
        abort.set(session.abort_handle());
        let kinds = session.forward().kv_kinds();
        Ok(Self {
            queue: Rc::default(),
            files,
            options,
            session: RefCell::new(Some(session)),
            conversation: RefCell::new(Vec::new()),
            abort,
            full_row_readback: Cell::new(false),
            closed: Cell::new(false),
            lost: Cell::new(false),
            rebuilds: Cell::new(0),
            on_rebuild: RefCell::new(None),
            session_kinds: Cell::new(Some(kinds)),
            draft: RefCell::new(None),
            backend_notice: notice,
            backend_choice: None,
        })
    }

    /// Why the model runs where it runs when that was not asked for: no usable GPU, or
    /// `auto`'s measured choice on a software adapter ([`Engine::backend_choice`]).
    pub fn backend_notice(&self) -> Option<&str> {
        self.backend_notice.as_deref()
    }

    /// The model's files.
    pub fn files(&self) -> &ModelFiles {
        &self.files
    }

    /// The options the engine was loaded with.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// Runs `f` on the session now, outside the queue; `None` while a request holds the
    /// session, after device loss until the rebuild, and once closed.
    pub fn inspect<T>(&self, f: impl FnOnce(&Session) -> T) -> Option<T> {
        self.session.borrow().as_ref().map(f)
    }

    /// The tokens of the conversation: what the KV cache held after the last request. They
    /// survive device loss (a rebuild replays them).
    pub fn cached_tokens(&self) -> Vec<u32> {
        self.conversation.borrow().clone()
    }

    /// How many times the engine was rebuilt on a new device after device loss.
    pub fn rebuilds(&self) -> u64 {
        self.rebuilds.get()
    }

    /// Calls `hook` with the new session after every rebuild (replacing an earlier hook).
    pub fn on_rebuild(&self, hook: impl FnMut(&Session) + 'static) {
        *self.on_rebuild.borrow_mut() = Some(Box::new(hook));
    }

    /// Reads back the whole logits row on every sampled decode step (see
    /// [`Session::set_full_row_readback`]); from the next request on, rebuilds included.
    pub fn set_full_row_readback(&self, on: bool) {
        self.full_row_readback.set(on);
    }

    /// Stops the running request, if any, between two tokens.
    pub fn abort(&self) {
        self.abort.abort();
    }

    /// A switch that stops the running request, usable from another thread.
    pub fn abort_switch(&self) -> AbortSwitch {
        self.abort.clone()
    }

    /// A handle that cancels one request (pass it to [`Engine::generate_cancellable`]).
    pub fn cancel_handle(&self) -> Cancel {
        Cancel::new(self.abort.clone())
    }

    /// Requests waiting for their turn (not counting the running one).
    pub fn waiting(&self) -> usize {
        self.queue.waiting()
    }

    /// Closes the engine: the running request stops at its next token, waiting and later
    /// requests fail with [`Error::Cancelled`], the model leaves the GPU once no request
    /// holds it.
    pub fn close(&self) {
        self.closed.set(true);
        self.abort();
        if let Ok(mut session) = self.session.try_borrow_mut() {
            session.take();
        }
    }

    /// Whether [`Engine::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.get() {
            return Err(Error::Cancelled("the engine was closed".into()));
        }
        Ok(())
    }

    /// Waits for the request's turn and takes the session (rebuilding it after device loss).
    async fn begin<'a>(&self, cancel: Option<&'a Cancel>) -> Result<(Running<'a>, Session)> {
        let turn = self.queue.turn().await;
        self.check_open()?;
        if let Some(c) = cancel {
            if c.is_cancelled() {
                return Err(Error::Cancelled(
                    "the request was cancelled before it started".into(),
                ));
            }
            c.set_running(true);
        }
        let running = Running {
            _turn: turn,
            cancel,
        };
        let present = self.session.borrow_mut().take();
        let mut session = match present {
            Some(session) => session,
            None => self.rebuild().await?,
        };
        session.set_full_row_readback(self.full_row_readback.get());
        Ok((running, session))
    }

    /// Puts the session back after a request, unless its device was lost (then the next
    /// request rebuilds it and the conversation stays as it was before this one).
    fn end<T>(&self, session: Session, result: Result<T>) -> Result<T> {
        if let Some(lost) = lost_error(&session, &result) {
            self.lost.set(true);
            return Err(lost);
        }
        *self.conversation.borrow_mut() = session.cached_tokens().to_vec();
        if !self.closed.get() {
            *self.session.borrow_mut() = Some(session);
        }
        result
    }

    /// Generates from `prompt` in its turn; `on_token` sees every token as it is produced.
    pub async fn generate(
        &self,
        prompt: &Prompt,
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Generation> {
        let (_running, mut session) = self.begin(None).await?;
        let result = session.generate(prompt, options, on_token).await;
        self.end(session, result)
    }

    /// [`Engine::generate`], stopped by `cancel` (made by [`Engine::cancel_handle`]) whether
    /// it waits in line or runs.
    pub async fn generate_cancellable(
        &self,
        cancel: &Cancel,
        prompt: &Prompt,
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Generation> {
        let (_running, mut session) = self.begin(Some(cancel)).await?;
        if cancel.is_cancelled() {
            return self.end(
                session,
                Err(Error::Cancelled(
                    "the request was cancelled before it started".into(),
                )),
            );
        }
        let result = session.generate(prompt, options, on_token).await;
        self.end(session, result)
    }

    /// Generates from every item, their sequences decoded together (see
    /// [`Session::generate_items`]); results in input order.
    pub async fn generate_items(
        &self,
        items: &[crate::session::BatchItem],
        max_batch: Option<usize>,
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Vec<Generation>> {
        let (_running, mut session) = self.begin(None).await?;
        let result = session.generate_items(items, max_batch, on_token).await;
        self.end(session, result)
    }

    /// Serves the feed's requests, their sequences decoded together, up to `slots` at once
    /// (see [`Session::serve`]), until the feed closes; the engine's turn is held meanwhile.
    /// After a device error (every request in flight was failed with it) the next call
    /// rebuilds the engine on a new device.
    pub async fn serve(&self, feed: &mut dyn crate::session::ItemFeed, slots: usize) -> Result<()> {
        let (_running, mut session) = self.begin(None).await?;
        let result = session.serve(feed, slots).await;
        self.end(session, result)
    }

    /// Generates from every prompt with the same options, decoded together (see
    /// [`Session::generate_batch`]).
    pub async fn generate_batch(
        &self,
        prompts: &[Prompt],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(&TokenEvent),
    ) -> Result<Vec<Generation>> {
        let (_running, mut session) = self.begin(None).await?;
        let result = session.generate_batch(prompts, options, on_token).await;
        self.end(session, result)
    }

    /// Mean negative log-likelihood of `tokens` (see [`Session::score`]); forgets the
    /// conversation.
    pub async fn score(&self, tokens: &[u32]) -> Result<Score> {
        let (_running, mut session) = self.begin(None).await?;
        let result = session.score(tokens).await;
        self.end(session, result)
    }

    /// The logits of every position of `tokens` (see [`Session::all_logits`]); forgets the
    /// conversation.
    pub async fn all_logits(&self, tokens: &[u32], decode: bool) -> Result<Vec<f32>> {
        let (_running, mut session) = self.begin(None).await?;
        let result = session.all_logits(tokens, decode).await;
        self.end(session, result)
    }

    /// Times the kernels (see [`Session::profile`]); forgets the conversation.
    pub async fn profile(
        &self,
        decode_pos: u32,
        prompt_tokens: u32,
    ) -> Result<crate::backend::gpu::Profile> {
        let (_running, mut session) = self.begin(None).await?;
        let result = session.profile(decode_pos, prompt_tokens).await;
        self.end(session, result)
    }

    /// Runs `f` on the session in its turn (rebuilding it after device loss, as a generation
    /// would).
    pub async fn with_session<T>(&self, f: impl FnOnce(&Session) -> Result<T>) -> Result<T> {
        let (_running, session) = self.begin(None).await?;
        let result = f(&session);
        self.end(session, result)
    }

    /// The conversation as bytes, with `note` (what the caller keeps with it), in its turn
    /// (see [`Session::save_state`]).
    pub async fn save_state(&self, note: Option<serde_json::Value>) -> Result<Vec<u8>> {
        let (_running, session) = self.begin(None).await?;
        let result = session.save_state(note).await;
        self.end(session, result)
    }

    /// Restores a saved conversation in its turn (see [`Session::restore_state`]; `file` names
    /// it in errors): the next request continues it. Returns the positions restored and the
    /// note saved with them.
    pub async fn restore_state(
        &self,
        bytes: &[u8],
        file: &str,
    ) -> Result<crate::session::Restored> {
        let (_running, mut session) = self.begin(None).await?;
        let result = session.restore_state(bytes, file).await;
        self.end(session, result)
    }

    /// Embeds `texts` in its turn (see [`Session::embed`]): one pooled final hidden state per
    /// text, `[texts][d]`; the conversation is kept.
    pub async fn embed(
        &self,
        texts: &[String],
        options: &crate::session::EmbedOptions,
    ) -> Result<crate::session::Embeddings> {
        let (_running, mut session) = self.begin(None).await?;
        let result = session.embed(texts, options).await;
        self.end(session, result)
    }

    /// Forgets the conversation in its turn: the next request starts from an empty KV cache.
    pub async fn reset(&self) -> Result<()> {
        let _turn = self.queue.turn().await;
        self.check_open()?;
        if let Some(session) = self.session.borrow_mut().as_mut() {
            session.reset();
        }
        self.conversation.borrow_mut().clear();
        Ok(())
    }

    /// Rebuilds the engine on a new device now (in its turn) if its device was lost, replaying
    /// the conversation; does nothing otherwise. Requests do this themselves when needed.
    pub async fn recover(&self) -> Result<()> {
        let _turn = self.queue.turn().await;
        self.check_open()?;
        if self.session.borrow().is_some() {
            return Ok(());
        }
        let session = self.rebuild().await?;
        *self.session.borrow_mut() = Some(session);
        Ok(())
    }

    /// Whether the device is known to be lost (a rebuild is due at the next request).
    pub fn is_lost(&self) -> bool {
        self.lost.get()
            || self
                .inspect(|s| s.gpu().is_some_and(GpuContext::is_lost))
                .unwrap_or(false)
    }

    /// A handle that destroys the current GPU device when fired, from anywhere (a token
    /// callback during a call included), to test device loss in the middle of a step; `None`
    /// on the CPU backend or while a call holds the session.
    pub fn loss_trigger_for_test(&self) -> Option<crate::backend::gpu::device::LossTrigger> {
        self.inspect(|s| s.gpu().map(GpuContext::loss_trigger_for_test))
            .flatten()
    }

    /// Destroys the GPU device in its turn, as a driver reset would, to test device-loss
    /// handling: the next request fails with [`Error::DeviceLost`], the one after it runs on a
    /// new device with the conversation replayed.
    pub async fn destroy_device_for_test(&self) {
        let _turn = self.queue.turn().await;
        if let Some(gpu) = self.session.borrow().as_ref().and_then(Session::gpu) {
            gpu.destroy_for_test();
        }
    }
}
