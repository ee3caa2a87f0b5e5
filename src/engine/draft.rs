//! The engine's draft model (speculative decoding): loaded into the session in its turn, and
//! kept as files so that a rebuild after device loss loads it again.

use super::Engine;
use crate::error::Result;
use crate::loader::ModelFiles;
use crate::session::Session;

impl Engine {
    /// Loads `files` as the draft model (see [`Session::load_draft`]) in its turn, replacing
    /// one loaded before. A draft refused before loading (another vocabulary) leaves the
    /// previous one in place; a failed upload leaves none.
    pub async fn load_draft(&self, files: ModelFiles) -> Result<()> {
        let (_running, mut session) = self.begin(None).await?;
        let result = session.load_draft(&files).await;
        if result.is_ok() {
            *self.draft.borrow_mut() = Some(files);
        } else if session.draft().is_none() {
            *self.draft.borrow_mut() = None;
        }
        self.end(session, result)
    }

    /// Drops the draft model in its turn.
    pub async fn unload_draft(&self) -> Result<()> {
        let (_running, mut session) = self.begin(None).await?;
        session.unload_draft();
        *self.draft.borrow_mut() = None;
        self.end(session, Ok(()))
    }

    /// Loads the kept draft into a rebuilt session (no borrow is held across the await).
    pub(super) async fn reload_draft(&self, session: &mut Session) -> Result<()> {
        let files = self.draft.borrow_mut().take();
        let Some(files) = files else {
            return Ok(());
        };
        let result = session.load_draft(&files).await;
        *self.draft.borrow_mut() = Some(files);
        result
    }
}
