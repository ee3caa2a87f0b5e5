//! `engine.stream()`: one generation's token events as a JavaScript async iterator.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use js_sys::{Function, Object, Promise};
use wasm_bindgen::prelude::*;

use super::engine::{event_js, generation_js};
use super::{check_alive, js_error, set, spawn_tracked, Rejecter};
use crate::engine::{Cancel, Engine};
use crate::session::{GenerateOptions, Prompt, TokenEvent};

/// How the generation behind a stream stands.
enum End {
    /// Still producing events.
    Running,
    /// Ended; its outcome has not been handed out yet.
    Done(Result<JsValue, JsValue>),
    /// Ended and reported (or abandoned by `return()`).
    Over,
}

/// The iterator's side of the stream.
struct State {
    /// Events not yet asked for.
    events: VecDeque<JsValue>,
    /// `next()` calls waiting for an event: their resolve and reject functions.
    waiting: VecDeque<(Function, Function)>,
    end: End,
}

/// `{ value, done }`.
fn step(value: &JsValue, done: bool) -> JsValue {
    let o = Object::new();
    set(&o, "value", value);
    set(&o, "done", &JsValue::from_bool(done));
    o.into()
}

impl State {
    fn push(&mut self, event: JsValue) {
        match self.waiting.pop_front() {
            Some((resolve, _)) => {
                let _ = resolve.call1(&JsValue::UNDEFINED, &step(&event, false));
            }
            None => self.events.push_back(event),
        }
    }

    fn finish(&mut self, outcome: Result<JsValue, JsValue>) {
        if !matches!(self.end, End::Running) {
            return;
        }
        self.end = End::Done(outcome);
        while !self.waiting.is_empty() && self.events.is_empty() {
            let promise = self.next();
            if let Some((resolve, _)) = self.waiting.pop_front() {
                let _ = resolve.call1(&JsValue::UNDEFINED, &promise);
            }
        }
    }

    /// What `next()` returns when nothing has to wait: a settled promise, or `None`.
    fn ready(&mut self) -> Option<Promise> {
        if let Some(event) = self.events.pop_front() {
            return Some(Promise::resolve(&step(&event, false)));
        }
        match std::mem::replace(&mut self.end, End::Over) {
            End::Running => {
                self.end = End::Running;
                None
            }
            End::Done(Ok(result)) => Some(Promise::resolve(&step(&result, true))),
            End::Done(Err(error)) => Some(Promise::reject(&error)),
            End::Over => Some(Promise::resolve(&step(&JsValue::UNDEFINED, true))),
        }
    }

    fn next(&mut self) -> Promise {
        if let Some(p) = self.ready() {
            return p;
        }
        let mut settle = None;
        let promise = Promise::new(&mut |resolve, reject| settle = Some((resolve, reject)));
        if let Some(s) = settle {
            self.waiting.push_back(s);
        }
        promise
    }
}

/// Starts (queues) the generation and returns its iterator. A parse error surfaces as the
/// first `next()` rejecting.
pub(crate) fn start(
    engine: Rc<Engine>,
    parsed: Result<(Prompt, GenerateOptions), JsValue>,
) -> JsValue {
    let state = Rc::new(RefCell::new(State {
        events: VecDeque::new(),
        waiting: VecDeque::new(),
        end: End::Running,
    }));
    let cancel = engine.cancel_handle();
    match check_alive().and(parsed) {
        Err(e) => state.borrow_mut().finish(Err(e)),
        Ok((prompt, options)) => spawn(engine, &cancel, &state, prompt, options),
    }
    iterator(cancel, state)
}

/// Queues the generation; its events and its outcome go to `state`.
fn spawn(
    engine: Rc<Engine>,
    cancel: &Cancel,
    state: &Rc<RefCell<State>>,
    prompt: Prompt,
    options: GenerateOptions,
) {
    let on_panic: Rejecter = {
        let state = Rc::clone(state);
        Rc::new(move |e: &JsValue| {
            if let Ok(mut s) = state.try_borrow_mut() {
                s.finish(Err(e.clone()));
            }
        })
    };
    let settle = {
        let state = Rc::clone(state);
        move |outcome: Result<JsValue, JsValue>| state.borrow_mut().finish(outcome)
    };
    let cancel = cancel.clone();
    let state = Rc::clone(state);
    let run = async move {
        let mut failure = None;
        let mut emit = |e: &TokenEvent| match event_js(e) {
            Ok(v) => state.borrow_mut().push(v),
            Err(err) => {
                failure.get_or_insert(err);
                cancel.cancel();
            }
        };
        let g = engine
            .generate_cancellable(&cancel, &prompt, &options, &mut emit)
            .await
            .map_err(|e| js_error(&e))?;
        match failure {
            Some(err) => Err(err),
            None => generation_js(&g),
        }
    };
    spawn_tracked(run, settle, on_panic);
}

/// Builds the iterator object: `next`, `return` and `[Symbol.asyncIterator]`.
fn iterator(cancel: Cancel, state: Rc<RefCell<State>>) -> JsValue {
    let it = Object::new();
    let next = {
        let state = Rc::clone(&state);
        Closure::<dyn FnMut() -> Promise>::new(move || state.borrow_mut().next())
    };
    let finish_early = Closure::<dyn FnMut() -> Promise>::new(move || {
        let mut s = state.borrow_mut();
        if matches!(s.end, End::Running) {
            cancel.cancel();
        }
        s.events.clear();
        s.end = End::Over;
        while let Some((resolve, _)) = s.waiting.pop_front() {
            let _ = resolve.call1(&JsValue::UNDEFINED, &step(&JsValue::UNDEFINED, true));
        }
        Promise::resolve(&step(&JsValue::UNDEFINED, true))
    });
    set(&it, "next", &next.into_js_value());
    set(&it, "return", &finish_early.into_js_value());
    // `[Symbol.asyncIterator]() { return this }` without eval and without a Rust closure
    // holding the object (that cycle would pass through wasm-bindgen's table, which the
    // garbage collector cannot see through, and keep the engine alive): `valueOf` of a
    // plain object returns the object itself.
    if let Ok(value_of) = js_sys::Reflect::get(&it, &JsValue::from_str("valueOf")) {
        if let Some(value_of) = value_of.dyn_ref::<Function>() {
            let _ =
                js_sys::Reflect::set(&it, &js_sys::Symbol::async_iterator(), &value_of.bind0(&it));
        }
    }
    it.into()
}
