//! `auto` on a software adapter: the GPU or the CPU backend, whichever measures faster.
//!
//! A software adapter (lavapipe, SwiftShader, WARP) runs the GPU's kernels on the CPU, usually
//! far slower than the CPU backend on the same cores, but not always (a many-core machine
//! with a single-threaded page). So `auto` times one decode step of the model on both, keeps
//! the faster, and records the choice in the tune store ([`crate::tune`]) under the adapter,
//! its driver, the model's shape, the KV cache's kinds (both are timed with the kinds asked for)
//! and the CPU's threads and instruction set; the next load reads the record and loads only the
//! chosen backend. A hardware adapter always runs the model, and so does a software one when
//! the options ask for what only the GPU backend does (f16 precision, forced kernels).

use serde::{Deserialize, Serialize};

use super::Engine;
use crate::backend::cpu::CpuPrecision;
use crate::backend::gpu::{AdapterReport, GpuContext, Precision};
use crate::dtype::kv::KvKinds;
use crate::error::Result;
use crate::loader::ModelFiles;
use crate::model::weights::ModelWeights;
use crate::session::Session;
use crate::tune::{Store, TuneKey};

/// Decode steps timed on the CPU backend (the fastest counts).
const CPU_STEPS: usize = 3;
/// Decode steps timed on the software adapter (slow: a step of a 135M model takes a second
/// or more on lavapipe).
const GPU_STEPS: usize = 2;

/// Where `auto` runs a model on a software adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Chosen {
    /// The (software) adapter.
    Gpu,
    /// The CPU backend.
    Cpu,
}

/// The measurement behind a choice, as the tune store keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Measured {
    backend: Chosen,
    gpu_ms: f64,
    cpu_ms: f64,
}

/// What [`Session::time_decode_step`] times for the model of `files`, in words.
fn timed_step(files: &ModelFiles) -> Result<String> {
    Ok(match files.weights()?.config.bidirectional {
        true => format!("a {}-token text", crate::session::ENCODER_TIMING_TOKENS),
        false => "a decode step".into(),
    })
}

/// What `auto` decided on a software adapter, and from what.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendChoice {
    /// Where the model runs.
    pub backend: Chosen,
    /// The software adapter's name.
    pub adapter: String,
    /// Milliseconds per decode step on the adapter (for an encoder, per text embedded: see
    /// [`Session::time_decode_step`]).
    pub gpu_ms: f64,
    /// Milliseconds per decode step (or text embedded) on the CPU backend.
    pub cpu_ms: f64,
    /// The step timed: `"a decode step"`, or an encoder's `"a 32-token text"`.
    pub step: String,
    /// The CPU backend's threads.
    pub threads: usize,
    /// `true`: timed during this load; `false`: read from the tune store.
    pub measured_now: bool,
    /// Where the record is kept (`None`: it could not be stored).
    pub stored_at: Option<String>,
}

impl BackendChoice {
    /// One line for people: both timings, the choice, and whether it was measured now.
    pub fn notice(&self) -> String {
        let threads = match self.threads {
            1 => "1 thread".to_string(),
            n => format!("{n} threads"),
        };
        format!(
            "`{}` is a software adapter: {} takes {:.1} ms on it and {:.1} ms on the CPU \
             backend ({threads}, {}); running on the {} ({})",
            self.adapter,
            self.step,
            self.gpu_ms,
            self.cpu_ms,
            crate::backend::cpu::dot::instruction_set(),
            match self.backend {
                Chosen::Gpu => "adapter",
                Chosen::Cpu => "CPU",
            },
            match (self.measured_now, &self.stored_at) {
                (true, Some(_)) => "measured on this load and kept for the next",
                (true, None) => "measured on this load; it could not be kept",
                (false, _) => "measured on an earlier load",
            }
        )
    }
}

/// Whether `options` ask for what only the GPU backend does (f16 matrix products, forced
/// kernel variants) or what the choice was not measured with (a KV-cache kind other than
/// f32): then `auto` keeps the adapter.
fn gpu_only(options: &super::EngineOptions) -> bool {
    let gpu = &options.gpu;
    gpu.precision == Precision::F16 || !gpu.kernels.is_empty()
}

/// The tune-store key of the choice: the adapter and driver, and what the two timings depend
/// on (the model's shape and weight types, the context, the KV cache's kinds, the CPU's threads
/// and instructions, and an exact f32 CPU product where asked for).
fn choice_key(
    report: &AdapterReport,
    weights: &ModelWeights<'_>,
    options: &super::EngineOptions,
    kinds: KvKinds,
) -> TuneKey {
    let (dims, types) = crate::backend::gpu::model_shape(weights);
    let mut shape = format!(
        "{dims} types={types} context={} kv={}/{} cpu={}x{}",
        options
            .context
            .map_or("default".to_string(), |n| n.to_string()),
        kinds.k,
        kinds.v,
        crate::backend::cpu::dot::instruction_set(),
        crate::backend::cpu::threads(),
    );
    if options.cpu_precision != CpuPrecision::Int8 {
        shape.push_str(&format!(
            " cpu-precision={}",
            options.cpu_precision.as_str()
        ));
    }
    TuneKey::new(
        "backend",
        format!(
            "{} [{}, {}]",
            report.name, report.backend, report.device_type
        ),
        format!("{} {}", report.driver, report.driver_info),
        shape,
    )
}

impl Engine {
    /// Whether `auto` runs a model on `gpu` without timing the CPU backend against it: a
    /// hardware adapter, or options only the GPU has.
    pub fn runs_on_the_adapter(gpu: &GpuContext, options: &super::EngineOptions) -> bool {
        !gpu.report().is_software() || gpu_only(options)
    }

    /// Loads `files` where `auto` runs them, given the adapter it found: a hardware adapter
    /// runs the model; on a software adapter the recorded choice is reused, or both backends
    /// are timed (see the [module docs](self)) and the faster kept. A model the software
    /// adapter cannot load runs on the CPU. `progress` sees the upload to the adapter.
    pub async fn load_auto(
        gpu: GpuContext,
        files: ModelFiles,
        options: super::EngineOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        if Self::runs_on_the_adapter(&gpu, &options) {
            return Self::new(gpu, files, options, progress).await;
        }
        let report = gpu.report().clone();
        let step = timed_step(&files)?;
        let kinds = options.gpu.kv_cache;
        let key = choice_key(&report, &files.weights()?, &options, kinds);
        let store = Store::platform();
        let stored_at = store.location(&key);
        if let Some(m) = store.load::<Measured>(&key).await {
            let choice = BackendChoice {
                backend: m.backend,
                adapter: report.name.clone(),
                gpu_ms: m.gpu_ms,
                cpu_ms: m.cpu_ms,
                step: step.clone(),
                threads: crate::backend::cpu::threads(),
                measured_now: false,
                stored_at,
            };
            let session = match m.backend {
                Chosen::Cpu => {
                    drop(gpu);
                    Session::new_cpu_in(
                        &files,
                        options.context,
                        options.cpu_precision,
                        options.starting_kinds(),
                    )?
                }
                Chosen::Gpu => {
                    Session::new_with_progress(gpu, &files, options.context, progress).await?
                }
            };
            return Self::chosen(session, files, options, choice).await;
        }
        // both are timed with the KV cache kinds asked for (their decode speeds differ by kind)
        let mut cpu = Session::new_cpu_in(&files, options.context, options.cpu_precision, kinds)?;
        let cpu_ms = cpu.time_decode_step(CPU_STEPS).await?;
        let mut on_gpu =
            match Session::new_with_progress(gpu, &files, options.context, progress).await {
                Ok(s) => s,
                Err(e) => {
                    let notice = format!(
                        "`{}` is a software adapter and could not load the model ({e}); running \
                         on the CPU",
                        report.name
                    );
                    return Self::from_session(cpu, files, options, Some(notice)).await;
                }
            };
        if on_gpu.forward().kv_kinds() != kinds {
            on_gpu.set_kv_kinds(kinds).await?;
        }
        let gpu_ms = on_gpu.time_decode_step(GPU_STEPS).await?;
        let backend = if cpu_ms <= gpu_ms {
            Chosen::Cpu
        } else {
            Chosen::Gpu
        };
        let m = Measured {
            backend,
            gpu_ms,
            cpu_ms,
        };
        // a choice that cannot be kept still holds for this load
        let kept = store.save(&key, &m).await.is_ok();
        let choice = BackendChoice {
            backend,
            adapter: report.name.clone(),
            gpu_ms,
            cpu_ms,
            step,
            threads: crate::backend::cpu::threads(),
            measured_now: true,
            stored_at: stored_at.filter(|_| kept),
        };
        let session = match backend {
            Chosen::Cpu => {
                drop(on_gpu);
                cpu
            }
            Chosen::Gpu => {
                drop(cpu);
                on_gpu
            }
        };
        Self::chosen(session, files, options, choice).await
    }

    /// The engine around the session `auto` chose, with the choice and its notice.
    async fn chosen(
        session: Session,
        files: ModelFiles,
        options: super::EngineOptions,
        choice: BackendChoice,
    ) -> Result<Self> {
        let mut engine = Self::from_session(session, files, options, Some(choice.notice())).await?;
        engine.backend_choice = Some(choice);
        Ok(engine)
    }

    /// What `auto` decided on a software adapter (`None`: it was not asked to decide, or the
    /// adapter is hardware, or there is none).
    pub fn backend_choice(&self) -> Option<&BackendChoice> {
        self.backend_choice.as_ref()
    }
}
