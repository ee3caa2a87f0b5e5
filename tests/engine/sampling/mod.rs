//! The CPU sampler: every logit processor on hand-computed vectors, greedy equivalences, the
//! statistics and reproducibility of seeded draws, parameter validation, JSON parsing and stop
//! strings in streamed text.

mod draws;
mod greedy;
mod json;
mod processors;
mod stop;
mod support;
mod validation;
