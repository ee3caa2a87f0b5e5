//! Stopping requests: [`AbortSwitch`] stops whichever request is running (from any thread),
//! [`Cancel`] stops one request, running or still waiting in line.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::{Arc, Mutex, PoisonError};

use crate::session::AbortHandle;

/// Stops the engine's running request between two tokens. Cloneable and `Send`: a Ctrl-C
/// handler on another thread can hold it. It follows the engine across device-loss rebuilds
/// (each rebuilt session has an abort handle of its own).
#[derive(Clone, Debug, Default)]
pub struct AbortSwitch(Arc<Mutex<AbortHandle>>);

impl AbortSwitch {
    /// Asks the running request, if any, to stop; it finishes with `FinishReason::Abort`.
    pub fn abort(&self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .abort();
    }

    /// Points the switch at a new session's handle.
    pub(crate) fn set(&self, handle: AbortHandle) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = handle;
    }
}

/// Where one request stands, for its [`Cancel`].
#[derive(Debug, Default)]
struct CancelState {
    cancelled: Cell<bool>,
    running: Cell<bool>,
}

/// Cancels one request: while it waits in line it is dropped when its turn comes (the call
/// fails with [`crate::Error::Cancelled`]); while it runs it is aborted between two tokens
/// (the call returns what it had, `FinishReason::Abort`); after it has finished, nothing.
/// Made by `Engine::cancel_handle`; one per request.
#[derive(Clone, Debug)]
pub struct Cancel {
    state: Rc<CancelState>,
    abort: AbortSwitch,
}

impl Cancel {
    pub(crate) fn new(abort: AbortSwitch) -> Self {
        Self {
            state: Rc::default(),
            abort,
        }
    }

    /// Cancels the request (see [`Cancel`]).
    pub fn cancel(&self) {
        self.state.cancelled.set(true);
        if self.state.running.get() {
            self.abort.abort();
        }
    }

    /// Whether [`Cancel::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.state.cancelled.get()
    }

    /// Whether the request has its turn and has not finished.
    pub fn is_running(&self) -> bool {
        self.state.running.get()
    }

    pub(crate) fn set_running(&self, on: bool) {
        self.state.running.set(on);
    }
}
