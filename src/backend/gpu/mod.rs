//! The GPU backend: the device context, buffers, the kernel cache, the typed kernels built on
//! it, and the forward pass that records a model's graph on them ([`Forward`], as a
//! [`crate::backend::Backend`] through [`GpuModel`]).

#[cfg(target_arch = "wasm32")]
mod browser;
pub mod buffer;
pub mod counters;
pub mod decode_plan;
pub mod device;
mod forward;
pub mod host_struct;
pub mod kernels;
pub mod key_split;
pub mod kv_cache;
pub mod ops;
pub mod plan;
pub mod precision;
pub mod tensor;
pub mod variants;

pub use counters::{AliveBuffers, Counters, CountersPer};
pub use decode_plan::{DecodePlan, DecodePlanMode};
pub use device::{AdapterReport, DeviceChoice, GpuContext, GpuOptions, LimitsReport};
pub(crate) use forward::model_shape;
pub use forward::{plan_key, Forward, GpuModel, Profile, ProfileRow, StepProfile};
pub use kernels::{Defines, KernelCache, ShaderFile};
pub use kv_cache::KvCache;
pub use ops::{
    Attention, AttentionBinding, Grid, Heads, KernelBinding, KeySplit, Qkv, Reduction, RopeKvWrite,
    Select, StepParams, StepRow, SwiGlu, WeightRead, MAX_HEAD_DIM, STEP_ROWS,
};
pub use plan::{Family, KernelOverrides, KernelPlan, SplitOverride, Variant};
pub use precision::{MatmulPrecision, Precision};
pub use tensor::GpuTensor;
