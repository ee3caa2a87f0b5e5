//! What a decode step asks the GPU to narrow down before sampling ([`SelectRequest`]), and the
//! compact answer it reads back instead of the whole logits row ([`Candidates`]).
//!
//! A leaf: the GPU's selection kernel (`gpu::ops::select`) and the sampler both build on this
//! wire format, and neither imports the other (also reachable as `sampling::candidates`).
//!
//! The GPU only selects; every decision stays in
//! [`Sampler::sample_candidates`](crate::sampling::Sampler::sample_candidates), which recomputes
//! the adjusted logits of the candidates exactly and says when they do not suffice (then the
//! whole row is read).

/// Keeps a processed logit finite: an overflow saturates at `±f32::MAX` instead of becoming
/// infinite (which would turn into NaN in the softmax). The sampler's processors use it too,
/// so the GPU-side adjustments and the CPU ones round alike.
pub(crate) fn saturate(x: f64) -> f32 {
    (x as f32).clamp(-f32::MAX, f32::MAX)
}

/// Most candidates one step can return (the kernel sorts them in one workgroup).
pub const MAX_CANDIDATES: usize = 256;

/// Most logit adjustments one step can upload; more read the whole row instead. With
/// [`MAX_CANDIDATES`] candidates the result still fits in [`MAX_RESULT_BYTES`].
pub const MAX_ADJUSTMENTS: usize = 240;

/// Words before the candidates in the result.
pub const RESULT_HEADER_WORDS: usize = 16;

/// Largest result a step reads back: header, 3 words per candidate, 1 per adjustment.
pub const MAX_RESULT_BYTES: usize =
    4 * (RESULT_HEADER_WORDS + 3 * MAX_CANDIDATES + MAX_ADJUSTMENTS);

/// GPU bytes one selection holds besides its logits-row scratch and mask bitset: the request
/// uniform (32), the adjustment list (32 bytes each), the result, and its share of a batched
/// step's readback.
pub const SELECT_BUFFER_BYTES: u64 = (32 + 32 * MAX_ADJUSTMENTS + 2 * MAX_RESULT_BYTES) as u64;

/// Presence and frequency penalties (OpenAI semantics) for a token generated `count` times
/// inside the penalty window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpenAiPenalty {
    /// Subtracted once.
    pub presence: f32,
    /// Subtracted `count` times.
    pub frequency: f32,
    /// How often the token was generated inside the window (at least 1).
    pub count: u32,
}

/// Everything the bias and the penalties do to one token's logit, in the sampler's order:
/// bias, then repetition penalty, then presence/frequency penalties.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogitAdjustment {
    /// Token id.
    pub id: u32,
    /// Added first (from `logit_bias`).
    pub bias: Option<f32>,
    /// Repetition penalty `r` (Hugging Face: a positive logit is divided by `r`, another
    /// multiplied), when the token is in the window and `r != 1`.
    pub repetition: Option<f32>,
    /// Presence/frequency penalties, when the token was generated inside the window and either
    /// penalty is non-zero.
    pub penalty: Option<OpenAiPenalty>,
}

impl LogitAdjustment {
    /// The adjusted logit, with exactly the arithmetic of [`crate::sampling::Sampler::process`]
    /// (f64, saturating at `±f32::MAX` after each step).
    pub fn apply(&self, x: f32) -> f32 {
        let mut x = x;
        if let Some(bias) = self.bias {
            x = saturate(f64::from(x) + f64::from(bias));
        }
        if let Some(r) = self.repetition {
            let (v, r) = (f64::from(x), f64::from(r));
            x = saturate(if v > 0.0 { v / r } else { v * r });
        }
        if let Some(p) = self.penalty {
            x = saturate(
                f64::from(x) - f64::from(p.presence) - f64::from(p.frequency) * f64::from(p.count),
            );
        }
        x
    }
}

/// One step's request to the GPU selection: the `k` largest adjusted logits of a row of `n`.
#[derive(Clone, Debug, PartialEq)]
pub struct SelectRequest {
    /// Length of the row to read (the sampler's vocabulary).
    pub n: u32,
    /// Candidates wanted, `1..=min(n, MAX_CANDIDATES)`.
    pub k: u32,
    /// Temperature of the tail sum (`1` when greedy); `> 0`.
    pub temperature: f32,
    /// Adjustments sorted by id, distinct ids, at most [`MAX_ADJUSTMENTS`].
    pub adjustments: Vec<LogitAdjustment>,
    /// A constraint's allowed tokens as a bitset (`[n.div_ceil(32)]` words, bit `i % 32` of
    /// word `i / 32` set: token `i` allowed), applied after the adjustments: a forbidden
    /// token's adjusted logit becomes `-f32::MAX`, below every allowed one, and adds nothing
    /// to the tail sums. `None`: every token allowed. Shared with the sampler's mask, not
    /// copied.
    pub mask: Option<std::sync::Arc<Vec<u32>>>,
}

impl SelectRequest {
    /// Bytes of the result this request produces: header, 3 words per candidate, 1 word per
    /// adjustment.
    pub fn result_bytes(&self) -> u64 {
        4 * (RESULT_HEADER_WORDS + 3 * self.k as usize + self.adjustments.len()) as u64
    }
}

/// The selection read back for one step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Candidates {
    /// The row held a NaN or an infinity (the other fields are then meaningless).
    pub non_finite: bool,
    /// Length of the row that was read.
    pub n: u32,
    /// Largest raw logit.
    pub raw_max: f32,
    /// `Σ exp(raw − raw_max)` over the row (f32 on the GPU).
    pub raw_sum: f32,
    /// Largest adjusted logit as the GPU computed it.
    pub adjusted_max: f32,
    /// `Σ exp((adjusted − adjusted_max) / temperature)` over the tokens not selected.
    pub tail_sum: f32,
    /// The part of `tail_sum` that comes from adjusted tokens.
    pub adjusted_tail_sum: f32,
    /// Selected ids, `[k]`, by adjusted value descending, ties to the lower id.
    pub ids: Vec<u32>,
    /// Their adjusted logits as the GPU computed them (f32 arithmetic: may differ from
    /// [`LogitAdjustment::apply`] in the last bit for penalised tokens), `[k]`.
    pub adjusted: Vec<f32>,
    /// Their raw logits, `[k]`.
    pub raw: Vec<f32>,
    /// The raw logit of each request adjustment's token, in request order, `[n_adjust]`.
    pub adjusted_raw: Vec<f32>,
}

impl Candidates {
    /// Parses the kernel's result words for `request` (see `shaders/select.wgsl`); `None` when
    /// the words do not have the request's shape.
    pub fn from_words(words: &[u32], request: &SelectRequest) -> Option<Self> {
        let k = request.k as usize;
        let n_adjust = request.adjustments.len();
        let header = words.get(..RESULT_HEADER_WORDS)?;
        if header[2] as usize != k || header[3] as usize != n_adjust {
            return None;
        }
        let body = words.get(RESULT_HEADER_WORDS..RESULT_HEADER_WORDS + 3 * k + n_adjust)?;
        let f = f32::from_bits;
        let (triples, adjusted_raw) = body.split_at(3 * k);
        Some(Self {
            non_finite: header[0] & 1 != 0,
            n: header[1],
            raw_max: f(header[4]),
            raw_sum: f(header[5]),
            adjusted_max: f(header[6]),
            tail_sum: f(header[7]),
            adjusted_tail_sum: f(header[8]),
            ids: triples.chunks_exact(3).map(|t| t[0]).collect(),
            adjusted: triples.chunks_exact(3).map(|t| f(t[1])).collect(),
            raw: triples.chunks_exact(3).map(|t| f(t[2])).collect(),
            adjusted_raw: adjusted_raw.iter().map(|&w| f(w)).collect(),
        })
    }
}
