//! First-come first-served turns for the engine's requests: an async mutex for a
//! single-threaded executor (the browser's task queue, or `pollster` natively). Futures stay
//! `!Send`; no lock is held across an `.await` except the turn itself.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use futures_channel::oneshot;

/// The waiting line. A request that is dropped while it waits gives up its place.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    busy: Cell<bool>,
    waiting: RefCell<VecDeque<oneshot::Sender<()>>>,
}

/// Holds the turn until dropped; dropping it hands the turn to the next request in line.
#[derive(Debug)]
pub(crate) struct Turn(Rc<Queue>);

impl Queue {
    /// Waits until every request that asked earlier has finished.
    pub(crate) async fn turn(self: &Rc<Self>) -> Turn {
        if self.busy.replace(true) {
            let (tx, rx) = oneshot::channel();
            self.waiting.borrow_mut().push_back(tx);
            // The turn is handed over by the previous holder (`busy` stays set).
            let _ = rx.await;
        }
        Turn(Rc::clone(self))
    }

    /// Requests waiting for their turn (not counting the one that holds it).
    pub(crate) fn waiting(&self) -> usize {
        self.waiting
            .borrow()
            .iter()
            .filter(|tx| !tx.is_canceled())
            .count()
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        loop {
            let next = self.0.waiting.borrow_mut().pop_front();
            match next {
                // A waiter that went away refuses the turn; try the next one.
                Some(tx) => {
                    if tx.send(()).is_ok() {
                        return;
                    }
                }
                None => {
                    self.0.busy.set(false);
                    return;
                }
            }
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use std::future::Future;

    use super::*;

    #[test]
    fn turns_go_in_order_and_dropped_waiters_give_way() {
        let queue = Rc::new(Queue::default());
        let first = pollster::block_on(queue.turn());
        let mut second = Box::pin(queue.turn());
        let third = queue.turn();
        // Poll the second once so it joins the line, then drop it.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(second.as_mut().poll(&mut cx).is_pending());
        assert_eq!(queue.waiting(), 1);
        drop(second);
        assert_eq!(queue.waiting(), 0);
        drop(first);
        // The third gets the turn at once: nobody holds it.
        let third = pollster::block_on(third);
        drop(third);
        assert!(!queue.busy.get());
    }
}
