//! The GPU context: adapter choice, a device with the limits and features the engine needs, and
//! the plumbing that turns asynchronous GPU failures (validation errors, device loss) into
//! [`Error`] values the caller sees on its next GPU call.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;

use super::counters::CounterCells;
use crate::error::{Error, Result};

/// What the caller may ask of [`GpuContext::new`].
#[derive(Debug, Clone)]
pub struct GpuOptions {
    /// Which adapter to prefer when several exist.
    pub power_preference: wgpu::PowerPreference,
    /// Request the `subgroups` feature when the adapter offers it.
    pub allow_subgroups: bool,
    /// Request the `shader-f16` feature when the adapter offers it.
    pub allow_shader_f16: bool,
    /// Longest a native readback may wait for the GPU before it is reported as an error
    /// (software adapters are slow, so this is generous). Ignored in the browser, where the
    /// browser's own watchdog turns a stuck queue into device loss.
    pub readback_timeout: std::time::Duration,
    /// Kernel variants forced for every model loaded on this context (on top of
    /// `EMBERLM_KERNELS`); the rest follow the measured plan.
    pub kernels: super::plan::KernelOverrides,
    /// The kinds K and V are cached in, for every model loaded on this context (default f32).
    pub kv_cache: crate::dtype::kv::KvKinds,
    /// How attention reads long contexts (key blocks per length, local windows).
    pub decode_plan: super::decode_plan::DecodePlan,
    /// The matrix products' precision (`f16` needs `shader-f16`; `auto` uses it when there).
    pub precision: super::precision::Precision,
    /// Which kind of device runs the model (`device`): any adapter, a hardware GPU only, or
    /// the CPU backend.
    pub device: DeviceChoice,
    /// A lower cap on the bytes one storage binding holds than the device grants (`None`: the
    /// device's `maxStorageBufferBindingSize`). Tensors larger than the cap are split by rows;
    /// tests force the split with it.
    pub binding_cap: Option<u64>,
}

/// Which kind of device runs the model (`--device`, `device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// A hardware adapter; on a software adapter (lavapipe, SwiftShader), it or the CPU
    /// backend, whichever measures faster (`Engine::load_auto`); the CPU backend where there
    /// is no adapter.
    #[default]
    Auto,
    /// The adapter, a software one included.
    Gpu,
    /// The CPU backend (no GPU is used).
    Cpu,
}

impl std::str::FromStr for DeviceChoice {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DeviceChoice::Auto),
            "gpu" | "webgpu" => Ok(DeviceChoice::Gpu),
            "cpu" => Ok(DeviceChoice::Cpu),
            other => Err(Error::invalid(
                "device",
                format!("`{other}` is not a device (auto, gpu or cpu)"),
            )),
        }
    }
}

/// How long a native readback waits: `EMBERLM_READBACK_TIMEOUT_S` seconds when set to a
/// positive number, else 300 (software adapters are slow, so this is generous).
fn readback_timeout() -> std::time::Duration {
    let seconds = std::env::var("EMBERLM_READBACK_TIMEOUT_S")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(300.0);
    std::time::Duration::from_secs_f64(seconds)
}

impl Default for GpuOptions {
    fn default() -> Self {
        Self {
            power_preference: wgpu::PowerPreference::HighPerformance,
            allow_subgroups: true,
            allow_shader_f16: true,
            readback_timeout: readback_timeout(),
            kernels: super::plan::KernelOverrides::none(),
            kv_cache: crate::dtype::kv::KvKinds::default(),
            decode_plan: super::decode_plan::DecodePlan::default(),
            precision: super::precision::Precision::default(),
            device: DeviceChoice::default(),
            binding_cap: None,
        }
    }
}

/// The device limits the engine reads, as granted to the device.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LimitsReport {
    /// Largest storage-buffer binding, bytes.
    pub max_storage_buffer_binding_size: u64,
    /// Largest buffer, bytes.
    pub max_buffer_size: u64,
    /// Storage buffers one shader stage may bind.
    pub max_storage_buffers_per_shader_stage: u32,
    /// Workgroup shared memory, bytes.
    pub max_compute_workgroup_storage_size: u32,
    /// Invocations in one workgroup.
    pub max_compute_invocations_per_workgroup: u32,
    /// Workgroups along one dispatch dimension.
    pub max_compute_workgroups_per_dimension: u32,
}

/// A description of the adapter and device in use, for logs, `engine.info()` and bug reports.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AdapterReport {
    /// Adapter name, e.g. `llvmpipe (LLVM 15.0.6, 256 bits)` or `SwiftShader Device`.
    pub name: String,
    /// PCI vendor id, 0 when unknown.
    pub vendor: u32,
    /// PCI device id, 0 when unknown.
    pub device: u32,
    /// `vulkan`, `metal`, `dx12`, `webgpu`, ...
    pub backend: String,
    /// `discrete-gpu`, `integrated-gpu`, `virtual-gpu`, `cpu` or `other`.
    pub device_type: String,
    /// Driver name, where the backend reports one.
    pub driver: String,
    /// Driver version details, where the backend reports them.
    pub driver_info: String,
    /// Every feature the adapter offers: in the browser, `GPUAdapter.features` as the browser
    /// lists them (some, like `subgroups`, wgpu cannot request there yet).
    pub adapter_features: Vec<String>,
    /// The features requested on the device.
    pub device_features: Vec<String>,
    /// Whether kernels may use subgroup operations on this device.
    pub subgroups: bool,
    /// Whether kernels may use `f16` on this device.
    pub shader_f16: bool,
    /// Smallest subgroup size the adapter may use (0 when unknown).
    pub subgroup_min_size: u32,
    /// Largest subgroup size the adapter may use (0 when unknown).
    pub subgroup_max_size: u32,
    /// The limits granted to the device.
    pub limits: LimitsReport,
}

impl AdapterReport {
    /// Whether the adapter is a CPU in disguise (lavapipe, SwiftShader, WARP): its device type,
    /// or its name where the browser hides the type.
    pub fn is_software(&self) -> bool {
        let name = self.name.to_lowercase();
        self.device_type == "cpu"
            || ["swiftshader", "llvmpipe", "lavapipe", "warp", "software"]
                .iter()
                .any(|n| name.contains(n))
    }
}

impl std::fmt::Display for AdapterReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} [{}, {}] subgroups={} shader-f16={} max_storage_binding={} MiB",
            self.name,
            self.backend,
            self.device_type,
            self.subgroups,
            self.shader_f16,
            self.limits.max_storage_buffer_binding_size >> 20
        )
    }
}

/// Failures reported by the device outside any call, kept until the next call collects them.
#[derive(Debug, Default)]
struct Health {
    lost: Option<Error>,
    uncaptured: Vec<Error>,
}

/// Uncaptured errors kept at most; later ones are counted by the first anyway.
const MAX_KEPT_ERRORS: usize = 16;

/// A GPU device ready for the engine's kernels.
///
/// Created asynchronously on both targets ([`GpuContext::new`]). GPU failures that happen
/// outside a call (validation errors from the driver, device loss) are recorded and returned as
/// [`Error`]s by the next [`GpuContext::check`] — every readback calls it — never as a panic.
pub struct GpuContext {
    /// The logical device.
    pub device: wgpu::Device,
    /// Its queue.
    pub queue: wgpu::Queue,
    report: AdapterReport,
    limits: wgpu::Limits,
    health: Arc<Mutex<Health>>,
    options: GpuOptions,
    precision: super::precision::MatmulPrecision,
    precision_notice: Option<String>,
    counters: Arc<CounterCells>,
    /// Created buffer bytes past which the allocation scopes report out-of-memory as the
    /// device would (`u64::MAX`: never); set by [`GpuContext::out_of_memory_past_for_test`].
    pub(super) simulated_memory: AtomicU64,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("adapter", &self.report.name)
            .finish_non_exhaustive()
    }
}

fn feature_names(features: wgpu::Features) -> Vec<String> {
    features
        .iter_names()
        .map(|(n, _)| n.to_lowercase().replace('_', "-"))
        .collect()
}

fn device_type_name(t: wgpu::DeviceType) -> &'static str {
    match t {
        wgpu::DeviceType::DiscreteGpu => "discrete-gpu",
        wgpu::DeviceType::IntegratedGpu => "integrated-gpu",
        wgpu::DeviceType::VirtualGpu => "virtual-gpu",
        wgpu::DeviceType::Cpu => "cpu",
        wgpu::DeviceType::Other => "other",
    }
}

/// The limits requested from an adapter offering `adapter`: WebGPU's defaults (or the
/// downlevel defaults on adapters below them) raised to the adapter's maximum where model size
/// or kernel shape depends on them.
fn required_limits(adapter: &wgpu::Limits) -> wgpu::Limits {
    let mut limits = if wgpu::Limits::default().check_limits(adapter) {
        wgpu::Limits::default()
    } else {
        wgpu::Limits::downlevel_defaults()
    };
    limits.max_storage_buffer_binding_size = adapter.max_storage_buffer_binding_size;
    limits.max_buffer_size = adapter.max_buffer_size;
    limits.max_storage_buffers_per_shader_stage = adapter.max_storage_buffers_per_shader_stage;
    limits.max_compute_workgroup_storage_size = adapter.max_compute_workgroup_storage_size;
    limits.max_compute_invocations_per_workgroup = adapter.max_compute_invocations_per_workgroup;
    limits.max_compute_workgroup_size_x = adapter.max_compute_workgroup_size_x;
    limits.max_compute_workgroups_per_dimension = adapter.max_compute_workgroups_per_dimension;
    limits
}

impl GpuContext {
    /// Picks an adapter, creates a device and installs the error and device-lost handlers.
    ///
    /// Natively the backend list honours `WGPU_BACKEND`; in the browser it is WebGPU.
    pub async fn new(options: GpuOptions) -> Result<Self> {
        if options.device == DeviceChoice::Cpu {
            return Err(Error::invalid(
                "device",
                "cpu asks for the CPU backend, but this needs a GPU device (generation, chat \
                 and batches run on the CPU; the GPU's kernels, profile and benchmarks do not)",
            ));
        }
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: options.power_preference,
                force_fallback_adapter: false,
                compatible_surface: None,
                apply_limit_buckets: false,
            })
            .await
            .map_err(|e| Error::NoAdapter(e.to_string()))?;
        let info = adapter.get_info();
        let offered = adapter.features();

        let mut wanted = wgpu::Features::empty();
        if options.allow_subgroups && offered.contains(wgpu::Features::SUBGROUP) {
            wanted |= wgpu::Features::SUBGROUP;
        }
        let f16_asked = options.precision != super::precision::Precision::F32;
        if (options.allow_shader_f16 || f16_asked) && offered.contains(wgpu::Features::SHADER_F16) {
            wanted |= wgpu::Features::SHADER_F16;
        }
        let limits = required_limits(&adapter.limits());
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("emberlm"),
                required_features: wanted,
                required_limits: limits.clone(),
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| Error::RequestDevice {
                adapter: info.name.clone(),
                message: e.to_string(),
            })?;

        let health = Arc::new(Mutex::new(Health::default()));
        let on_error = Arc::clone(&health);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let err = match e {
                wgpu::Error::OutOfMemory { source } => Error::Gpu {
                    kind: "out-of-memory",
                    message: source.to_string(),
                },
                wgpu::Error::Validation { description, .. } => Error::Gpu {
                    kind: "validation",
                    message: description,
                },
                wgpu::Error::Internal { description, .. } => Error::Gpu {
                    kind: "internal",
                    message: description,
                },
            };
            let mut h = on_error.lock().unwrap_or_else(PoisonError::into_inner);
            if h.uncaptured.len() < MAX_KEPT_ERRORS {
                h.uncaptured.push(err);
            }
        }));
        let on_lost = Arc::clone(&health);
        device.set_device_lost_callback(move |reason, message| {
            let reason = match reason {
                wgpu::DeviceLostReason::Destroyed => "destroyed",
                wgpu::DeviceLostReason::Unknown => "unknown",
            };
            let mut h = on_lost.lock().unwrap_or_else(PoisonError::into_inner);
            h.lost.get_or_insert(Error::DeviceLost {
                reason: reason.to_string(),
                message,
            });
        });

        let granted = device.features();
        #[allow(unused_mut)]
        let (mut name, mut adapter_features) = (info.name.clone(), feature_names(offered));
        #[cfg(target_arch = "wasm32")]
        {
            let preference = match options.power_preference {
                wgpu::PowerPreference::LowPower => "low-power",
                _ => "high-performance",
            };
            if let Some(browser) = super::browser::describe(preference).await {
                if name.is_empty() {
                    name = browser.name;
                }
                adapter_features = browser.features;
            }
        }
        let report = AdapterReport {
            name,
            vendor: info.vendor,
            device: info.device,
            backend: info.backend.to_str().to_string(),
            device_type: device_type_name(info.device_type).to_string(),
            driver: info.driver.clone(),
            driver_info: info.driver_info.clone(),
            adapter_features,
            device_features: feature_names(granted),
            subgroups: granted.contains(wgpu::Features::SUBGROUP),
            shader_f16: granted.contains(wgpu::Features::SHADER_F16),
            subgroup_min_size: info.subgroup_min_size,
            subgroup_max_size: info.subgroup_max_size,
            limits: LimitsReport {
                max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
                max_buffer_size: limits.max_buffer_size,
                max_storage_buffers_per_shader_stage: limits.max_storage_buffers_per_shader_stage,
                max_compute_workgroup_storage_size: limits.max_compute_workgroup_storage_size,
                max_compute_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
                max_compute_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
            },
        };
        let (precision, precision_notice) = options.precision.resolve(
            granted.contains(wgpu::Features::SHADER_F16),
            report.is_software(),
        )?;
        Ok(Self {
            device,
            queue,
            report,
            limits,
            health,
            options,
            precision,
            precision_notice,
            counters: Arc::default(),
            simulated_memory: AtomicU64::new(u64::MAX),
        })
    }

    /// The adapter and device description.
    pub fn report(&self) -> &AdapterReport {
        &self.report
    }

    /// The limits granted to the device.
    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    /// The most bytes one storage binding of a weight may hold: the device's
    /// `maxStorageBufferBindingSize`, or [`GpuOptions::binding_cap`] when lower.
    pub fn binding_limit(&self) -> u64 {
        let granted = self.limits.max_storage_buffer_binding_size;
        self.options
            .binding_cap
            .map_or(granted, |cap| cap.min(granted))
    }

    /// The options the context was created with.
    pub fn options(&self) -> &GpuOptions {
        &self.options
    }

    /// The precision the matrix products run in (`precision` resolved on this adapter).
    pub fn precision(&self) -> super::precision::MatmulPrecision {
        self.precision
    }

    /// Why `precision: auto` runs in f32 here, when it does.
    pub fn precision_notice(&self) -> Option<&str> {
        self.precision_notice.as_deref()
    }

    /// A snapshot of the engine counters.
    pub fn counters(&self) -> super::Counters {
        self.counter_cells().snapshot()
    }

    /// The live engine counters, for the structures that count into them.
    pub(crate) fn counter_cells(&self) -> &Arc<CounterCells> {
        &self.counters
    }

    /// Whether kernels may use subgroup operations.
    pub fn has_subgroups(&self) -> bool {
        self.report.subgroups
    }

    /// Returns the device's recorded failure, if any: device loss first (it is permanent),
    /// otherwise the oldest uncaptured error (which is consumed).
    pub fn check(&self) -> Result<()> {
        let mut h = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(lost) = &h.lost {
            return Err(lost.clone());
        }
        if h.uncaptured.is_empty() {
            Ok(())
        } else {
            Err(h.uncaptured.remove(0))
        }
    }

    /// The device-lost error once the device is lost.
    pub fn lost_error(&self) -> Option<Error> {
        self.health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .lost
            .clone()
    }

    /// Whether the device has been lost; a lost context must be replaced.
    pub fn is_lost(&self) -> bool {
        self.lost_error().is_some()
    }

    /// Destroys the device, as a driver reset would; used to test device-loss handling.
    pub fn destroy_for_test(&self) {
        self.device.destroy();
    }

    /// A handle that destroys this device from anywhere, a token callback in the middle of a
    /// call included; used to test device loss during a step.
    pub fn loss_trigger_for_test(&self) -> LossTrigger {
        LossTrigger(self.device.clone())
    }
}

/// Destroys a device when fired, as a driver reset would (see
/// [`GpuContext::loss_trigger_for_test`]).
#[derive(Debug, Clone)]
pub struct LossTrigger(wgpu::Device);

impl LossTrigger {
    /// Destroys the device: every later use of it fails as a lost device.
    pub fn fire(&self) {
        self.0.destroy();
    }
}
