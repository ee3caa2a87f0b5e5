//! CPU-side token sampling: parameters, logit processing, drawing and stop strings.

pub mod params;
pub mod sampler;
pub mod stop;

pub use params::SamplingParams;
pub use sampler::{log_softmax, Sampled, Sampler};
pub use stop::{StopMatcher, StopOutput};
