//! What a forward step is asked to read back and what it returns, and the memory a model
//! holds, for either backend.

use crate::candidates::{Candidates, SelectRequest};
use crate::error::Result;

/// Called after each step of [`Readback::EachStep`] with the index of the step's first token,
/// its token count and its logits; returns whether to go on.
pub type OnStep<'r> = dyn FnMut(usize, usize, Vec<f32>) -> Result<bool> + 'r;

/// What [`super::Backend::run`] reads back.
pub enum Readback<'r> {
    /// Nothing (a prefill whose logits nobody needs: the head does not run either).
    None,
    /// The last token's logits row, `[vocab]`.
    LastRow,
    /// Every token's logits, `[tokens · vocab]`.
    AllRows,
    /// Every token's final hidden state instead of its logits, `[tokens · d]`: the residual
    /// stream after the last layer through the model's final norm; the LM head does not run
    /// ([`Output::Hidden`]).
    Hidden,
    /// The selection `request` asks for over the last token's logits (the logits stay on the
    /// device).
    Candidates(&'r SelectRequest),
    /// The selection `requests[i]` asks for over token i's logits, one request per token,
    /// for a run that fits one step (a speculative step's verification): the logits stay on
    /// the device and one readback returns every row's candidates
    /// ([`Output::RowCandidates`]). Where the device cannot run the selection for that many
    /// rows, every row's logits come back instead, as for [`Readback::AllRows`].
    RowCandidates(&'r [SelectRequest]),
    /// For a [`super::Rows::Batch`] step only: sequence i's selection `requests[i]` over its
    /// row of logits ([`Output::Sequences`]). With a request for every sequence and a device
    /// that runs the selection, each sequence's candidates come back; otherwise every row's
    /// logits.
    Sequences(&'r [Option<&'r SelectRequest>]),
    /// Step by step, so that a caller can stop between steps and never holds more than one
    /// step's logits: `on_step(first, n, rows)` after each step gets every row
    /// (`[n · vocab]`) when `all_rows`, else the last token's row (`[vocab]`) after the last
    /// step and nothing before.
    EachStep {
        /// Every row of every step, or the last token's.
        all_rows: bool,
        /// Receives each step; `false` stops the run (the cache holds the steps run).
        on_step: &'r mut OnStep<'r>,
    },
}

impl<'r> Readback<'r> {
    /// Whether the step runs the LM head (every readback but [`Readback::None`] and
    /// [`Readback::Hidden`]): an encoder, which has none, refuses it before anything runs.
    pub(crate) fn reads_logits(&self) -> bool {
        !matches!(self, Readback::None | Readback::Hidden)
    }

    /// The per-sequence requests of a batched step ([`Readback::Sequences`]); any other
    /// readback is an error naming it (a batched step reads one row per sequence).
    pub(crate) fn sequences(self) -> Result<&'r [Option<&'r SelectRequest>]> {
        match self {
            Readback::Sequences(requests) => Ok(requests),
            other => Err(crate::error::Error::invalid(
                "readback",
                format!("a batched step reads per-sequence rows, not {other:?}"),
            )),
        }
    }
}

impl std::fmt::Debug for Readback<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Readback::None => f.write_str("None"),
            Readback::LastRow => f.write_str("LastRow"),
            Readback::AllRows => f.write_str("AllRows"),
            Readback::Hidden => f.write_str("Hidden"),
            Readback::Candidates(r) => f.debug_tuple("Candidates").field(r).finish(),
            Readback::RowCandidates(r) => f.debug_tuple("RowCandidates").field(r).finish(),
            Readback::Sequences(r) => f.debug_tuple("Sequences").field(r).finish(),
            Readback::EachStep { all_rows, .. } => f
                .debug_struct("EachStep")
                .field("all_rows", all_rows)
                .finish_non_exhaustive(),
        }
    }
}

/// What [`super::Backend::run`] returns.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// [`Readback::None`].
    None,
    /// Logits, `[rows · vocab]` (one row for [`Readback::LastRow`], and for
    /// [`Readback::Candidates`] on a device that cannot run the selection).
    Logits(Vec<f32>),
    /// [`Readback::Hidden`]: every token's final hidden state, `[tokens · d]`.
    Hidden(Vec<f32>),
    /// The selection's result.
    Candidates(Candidates),
    /// Each row's selection ([`Readback::RowCandidates`]), `[tokens]`.
    RowCandidates(Vec<Candidates>),
    /// Each sequence's row of a batched step ([`Readback::Sequences`]), `[sequences]`.
    Sequences(Vec<StepLogits>),
    /// [`Readback::EachStep`] ran every token, or stopped after `ran` of them.
    Stepped {
        /// Tokens run (the cache holds them).
        ran: usize,
    },
}

/// What a one-token decode step read back.
#[derive(Debug, Clone, PartialEq)]
pub enum StepLogits {
    /// The GPU's selection from the logits row (at most `MAX_RESULT_BYTES` read back).
    Candidates(Candidates),
    /// The whole logits row, `[vocab]`.
    Full(Vec<f32>),
}

/// Memory a backend allocated for a model at load, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryReport {
    /// Model weights as uploaded (stored type; 1-D tensors as f32).
    pub weights: u64,
    /// The KV cache (`layers · context ·` the bytes of a K and a V row in their kinds).
    pub kv_cache: u64,
    /// Activations for one chunk, the step uniform, the readback staging buffer and the
    /// kernels' parameter uniforms.
    pub activations: u64,
    /// Bytes of K and V one more position of context costs: every layer's, but for local
    /// layers, whose rings do not grow.
    pub kv_bytes_per_token: u64,
    /// Batched decoding's per-sequence selection buffers and readback
    /// ([`super::Backend::set_batch`]; its extra KV slots count in `kv_cache`).
    pub batch: u64,
}

impl MemoryReport {
    /// Everything.
    pub fn total(&self) -> u64 {
        self.weights + self.kv_cache + self.activations + self.batch
    }
}

/// Which rows of a step's logits the head computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Head {
    None,
    /// The last row (into row 0 on the GPU).
    Last,
    All,
    /// No head: every row's final hidden state (`[n, d]`, after the final norm).
    Hidden,
}

/// A run's steps as a [`Readback`] asks for them, for either backend: which rows each step's
/// head computes, where each step's logits go (kept, or handed to `on_step`), and what the run
/// returns.
pub(super) struct Collect<'r> {
    nothing: bool,
    hidden: bool,
    all_rows: bool,
    on_step: Option<&'r mut OnStep<'r>>,
    logits: Vec<f32>,
}

impl<'r> Collect<'r> {
    /// The collector for `readback` over `tokens` tokens, and the selection requests for the
    /// run's last step (row i with request i; empty: no selection): a request for the last
    /// row when the backend can run the selection on one row (`rows` ≥ 1), one per row when
    /// on `tokens` rows in one step. Otherwise a request for candidates reads the last row,
    /// and one per row reads every row. Errors when the per-row requests do not match the
    /// tokens.
    pub(super) fn new(
        readback: Readback<'r>,
        tokens: usize,
        rows: usize,
    ) -> Result<(Self, &'r [SelectRequest])> {
        let nothing = matches!(readback, Readback::None);
        let hidden = matches!(readback, Readback::Hidden);
        let (all_rows, on_step, requests): (_, _, &[SelectRequest]) = match readback {
            Readback::EachStep { all_rows, on_step } => (all_rows, Some(on_step), &[]),
            Readback::AllRows => (true, None, &[]),
            Readback::Candidates(request) if rows >= 1 => {
                (false, None, std::slice::from_ref(request))
            }
            Readback::RowCandidates(requests) if requests.len() != tokens => {
                return Err(crate::error::Error::invalid(
                    "requests",
                    format!("{} selection requests for {tokens} tokens", requests.len()),
                ))
            }
            Readback::RowCandidates(requests) if rows >= tokens => (true, None, requests),
            Readback::RowCandidates(_) => (true, None, &[]),
            Readback::Sequences(_) => {
                return Err(crate::error::Error::invalid(
                    "readback",
                    "per-sequence selections are for a batched step only",
                ))
            }
            _ => (false, None, &[]),
        };
        let collect = Self {
            nothing,
            hidden,
            all_rows,
            on_step,
            logits: Vec::new(),
        };
        Ok((collect, requests))
    }

    /// The rows the head of a step computes (`last`: the run's last step).
    pub(super) fn head(&self, last: bool) -> Head {
        match () {
            _ if self.nothing => Head::None,
            _ if self.hidden => Head::Hidden,
            _ if self.all_rows => Head::All,
            _ if !last => Head::None,
            _ => Head::Last,
        }
    }

    /// Takes a step's logits or hidden rows (`n` tokens from the run's token `first` on; `ran` tokens run in
    /// all); `Some` ends the run early (`on_step` said stop).
    pub(super) fn step(
        &mut self,
        first: usize,
        n: usize,
        rows: Vec<f32>,
        last: bool,
        ran: usize,
    ) -> Result<Option<Output>> {
        match self.on_step.as_mut() {
            Some(on_step) => {
                if !on_step(first, n, rows)? && !last {
                    return Ok(Some(Output::Stepped { ran }));
                }
            }
            None => self.logits.extend(rows),
        }
        Ok(None)
    }

    /// What the run returns after `ran` tokens.
    pub(super) fn finish(self, ran: usize) -> Output {
        match (self.nothing, self.on_step) {
            (true, _) => Output::None,
            _ if self.hidden => Output::Hidden(self.logits),
            (false, Some(_)) => Output::Stepped { ran },
            (false, None) => Output::Logits(self.logits),
        }
    }
}
