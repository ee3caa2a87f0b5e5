//! Everything that touches the GPU: the device context, buffers, the kernel cache and the
//! typed kernels built on it.

#[cfg(target_arch = "wasm32")]
mod browser;
pub mod buffer;
pub mod counters;
pub mod decode_plan;
pub mod device;
pub mod kernels;
pub mod key_split;
pub mod kv_cache;
pub mod ops;
pub mod plan;
pub mod precision;
pub mod tensor;

pub use counters::{AliveBuffers, Counters, CountersPer};
pub use decode_plan::{DecodePlan, DecodePlanMode};
pub use device::{AdapterReport, DeviceChoice, GpuContext, GpuOptions, LimitsReport};
pub use kernels::{Defines, KernelCache, ShaderFile};
pub use kv_cache::KvCache;
pub use ops::{
    Attention, AttentionBinding, Grid, Heads, KernelBinding, KeySplit, Qkv, Reduction, RopeKvWrite,
    Select, StepParams, StepRow, SwiGlu, WeightRead, MAX_HEAD_DIM, STEP_ROWS,
};
pub use plan::{Family, KernelOverrides, KernelPlan, SplitOverride, Variant};
pub use precision::{MatmulPrecision, Precision};
pub use tensor::GpuTensor;
