//! Device-loss recovery: a new device, the model uploaded again from the files the engine
//! kept, and the conversation's tokens replayed into the new KV cache.

use super::Engine;
use crate::backend::gpu::GpuContext;
use crate::error::{Error, Result};
use crate::session::Session;

impl Engine {
    /// A new session on a new device with the conversation replayed. Fails when the device or
    /// the upload fails, or when the new device is lost during the replay (the conversation is
    /// kept for the next try); another replay failure leaves the conversation empty.
    pub(super) async fn rebuild(&self) -> Result<Session> {
        let gpu = GpuContext::new(self.options.gpu.clone()).await?;
        let mut session = Session::new(gpu, &self.files, self.options.context).await?;
        if let Some(source) = &self.options.chat_template {
            session.set_chat_template(source)?;
        }
        // the automatic plan's choice stands: the same kinds on the new device
        let decided = self.session_kinds.get();
        if let Some(kinds) = decided.filter(|k| *k != session.forward().kv_kinds()) {
            session.set_kv_kinds(kinds).await?;
        }
        self.reload_draft(&mut session).await?;
        self.abort.set(session.abort_handle());
        let tokens = self.conversation.borrow().clone();
        match session.restore(&tokens).await {
            Ok(()) => {}
            Err(e @ Error::DeviceLost { .. }) => return Err(e),
            Err(e) if session.gpu().is_some_and(GpuContext::is_lost) => return Err(e),
            // The session reset itself; the conversation is gone but the model works.
            Err(_) => {}
        }
        *self.conversation.borrow_mut() = session.cached_tokens().to_vec();
        self.lost.set(false);
        self.rebuilds.set(self.rebuilds.get() + 1);
        if let Some(hook) = self.on_rebuild.borrow_mut().as_mut() {
            hook(&session);
        }
        Ok(session)
    }
}
