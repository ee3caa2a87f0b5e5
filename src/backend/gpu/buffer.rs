//! Buffer creation checked against the device limits, and readback from GPU to CPU.

use std::sync::atomic::Ordering;

use bytemuck::Pod;
use wgpu::util::DeviceExt;

use super::device::GpuContext;
use crate::error::{Error, Result};

/// Usage of buffers that kernels read or write and that tests may copy in and out.
pub const STORAGE_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

impl GpuContext {
    /// Fails with [`Error::Limit`] when a storage buffer of `bytes` cannot exist or be bound.
    pub fn check_storage_size(&self, label: &str, bytes: u64) -> Result<()> {
        let limits = self.limits();
        for (limit, allowed) in [
            ("maxBufferSize", limits.max_buffer_size),
            (
                "maxStorageBufferBindingSize",
                limits.max_storage_buffer_binding_size,
            ),
        ] {
            if bytes > allowed {
                return Err(Error::Limit {
                    what: format!("buffer `{label}`"),
                    limit,
                    needed: bytes,
                    allowed,
                });
            }
        }
        Ok(())
    }

    /// A storage buffer holding `data` (at least 4 bytes, since empty bindings are invalid).
    pub fn storage_from<T: Pod>(&self, label: &str, data: &[T]) -> Result<wgpu::Buffer> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        self.check_storage_size(label, bytes.len() as u64)?;
        // a buffer mapped at creation on a lost device cannot be filled (wgpu panics)
        if let Some(lost) = self.lost_error() {
            return Err(lost);
        }
        let contents: &[u8] = if bytes.is_empty() { &[0; 4] } else { bytes };
        self.counter_cells()
            .buffer_created(contents.len().div_ceil(4) as u64 * 4);
        Ok(self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents,
                usage: STORAGE_USAGE,
            }))
    }

    /// A zero-filled storage buffer of `bytes` bytes (rounded up to a multiple of 4, at least 4).
    pub fn storage_zeroed(&self, label: &str, bytes: u64) -> Result<wgpu::Buffer> {
        let size = bytes.max(4).div_ceil(4) * 4;
        self.check_storage_size(label, size)?;
        self.counter_cells().buffer_created(size);
        Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: STORAGE_USAGE,
            mapped_at_creation: false,
        }))
    }

    /// A uniform buffer holding one `value` (kernel parameters). Written through the queue
    /// rather than mapped at creation, so that on a lost device it fails as a lost device
    /// (reported by the next check) instead of panicking.
    pub fn uniform_from<T: Pod>(&self, label: &str, value: &T) -> wgpu::Buffer {
        let bytes = bytemuck::bytes_of(value);
        let size = (bytes.len().max(4).div_ceil(4) * 4) as u64;
        self.counter_cells().buffer_created(size);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if bytes.len() as u64 == size {
            self.queue.write_buffer(&buffer, 0, bytes);
        } else {
            let mut padded = bytes.to_vec();
            padded.resize(size as usize, 0);
            self.queue.write_buffer(&buffer, 0, &padded);
        }
        buffer
    }

    /// Encodes one compute pass with `record`, submits it, and returns the submission index.
    pub fn submit_pass(
        &self,
        label: &str,
        record: impl FnOnce(&mut wgpu::ComputePass<'_>),
    ) -> wgpu::SubmissionIndex {
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
        self.counter_cells().compute_pass();
        self.counter_cells().submit(1);
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(label),
                timestamp_writes: None,
            });
            record(&mut pass);
        }
        self.queue.submit([encoder.finish()])
    }

    /// Lets the native backend run its pending callbacks (device loss is only reported from
    /// there) without waiting for the GPU. The browser runs them from its event loop.
    fn settle(&self) {
        #[cfg(not(target_arch = "wasm32"))]
        {
            // An error here is a lost device, which the callback has just recorded.
            let _ = self.device.poll(wgpu::PollType::Poll);
        }
    }

    /// Copies the first `len` f32 values of `src` to the CPU.
    ///
    /// Waits for all work submitted before it; returns the device's recorded failure (device
    /// loss, validation error) instead of data when there is one, since the data would be garbage.
    pub async fn read_f32(&self, src: &wgpu::Buffer, len: usize) -> Result<Vec<f32>> {
        let bytes = self.read_bytes(src, len as u64 * 4).await?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Copies the first `bytes` bytes of `src` (a multiple of 4) to the CPU; see [`Self::read_f32`].
    pub async fn read_bytes(&self, src: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>> {
        let label = || format!("{src:?}");
        if !bytes.is_multiple_of(4) || bytes > src.size() {
            return Err(Error::Readback {
                buffer: label(),
                message: format!(
                    "asked for {bytes} bytes of a {}-byte buffer (must be a multiple of 4 and fit)",
                    src.size()
                ),
            });
        }
        self.settle();
        self.check()?;
        if bytes == 0 {
            return Ok(Vec::new());
        }
        let staging = self.staging_buffer("emberlm readback", bytes);
        let _alive = super::AliveBuffers::new(self.counter_cells(), [staging.size()]);
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("emberlm readback"),
            });
        encoder.copy_buffer_to_buffer(src, 0, &staging, 0, bytes);
        self.counter_cells().submit(1);
        let submission = self.queue.submit([encoder.finish()]);
        self.read_staging(&staging, bytes, submission).await
    }

    /// A buffer the GPU copies results into and the CPU maps (MAP_READ | COPY_DST).
    pub fn staging_buffer(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        let size = bytes.max(4).div_ceil(4) * 4;
        self.counter_cells().buffer_created(size);
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Maps `staging` after `submission` (which copied into it) and returns its first `bytes`
    /// bytes; reports the device's recorded failure instead when there is one. The buffer is
    /// unmapped again, ready for the next step.
    pub async fn read_staging(
        &self,
        staging: &wgpu::Buffer,
        bytes: u64,
        submission: wgpu::SubmissionIndex,
    ) -> Result<Vec<u8>> {
        let label = || {
            format!(
                "readback of {bytes} bytes (staging buffer of {})",
                staging.size()
            )
        };
        if bytes > staging.size() {
            return Err(Error::Readback {
                buffer: label(),
                message: format!("asked for {bytes} bytes of {}", staging.size()),
            });
        }
        let _ = &submission;
        self.counter_cells().readback(bytes);
        let (tx, rx) = futures_channel::oneshot::channel();
        staging
            .slice(..bytes)
            .map_async(wgpu::MapMode::Read, move |result| {
                // The receiver is only gone if the caller stopped waiting; nothing to report then.
                let _ = tx.send(result);
            });
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(submission),
                timeout: Some(self.options().readback_timeout),
            })
            .map_err(|e| {
                self.settle();
                self.check().err().unwrap_or(Error::Readback {
                    buffer: label(),
                    message: format!(
                        "waiting for the GPU ({:.0} s at most; set EMBERLM_READBACK_TIMEOUT_S for a \
                         slower adapter or a busy machine): {e}",
                        self.options().readback_timeout.as_secs_f64()
                    ),
                })
            })?;
        let mapped = rx.await.map_err(|_| Error::Readback {
            buffer: label(),
            message: "the map callback was dropped without being called".into(),
        })?;
        // A failed map is most often the symptom of device loss; report the cause when known.
        self.settle();
        self.check()?;
        mapped.map_err(|e| Error::Readback {
            buffer: label(),
            message: e.to_string(),
        })?;
        let data = staging
            .slice(..bytes)
            .get_mapped_range()
            .map_err(|e| Error::Readback {
                buffer: label(),
                message: e.to_string(),
            })?
            .to_vec();
        staging.unmap();
        Ok(data)
    }
}

/// Where a load's allocations began, so that an out-of-memory error can say how much the load
/// had made ([`GpuContext::load_memory`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LoadMemory {
    created_before: u64,
}

/// One part of a load's allocations watched for out-of-memory: an error scope pushed by
/// [`LoadMemory::allocating`] and closed by [`Allocating::done`], which turns a
/// `GPUOutOfMemoryError` (or, in tests, [`GpuContext::out_of_memory_past_for_test`]) into
/// [`Error::OutOfMemory`] naming what was being allocated. Nothing may be awaited between the
/// two: the scope belongs to the thread that pushed it.
#[must_use = "an allocation scope is closed with `done`, which says whether the GPU had the memory"]
pub(crate) struct Allocating {
    scope: wgpu::ErrorScopeGuard,
    what: String,
    load: LoadMemory,
}

impl GpuContext {
    /// Starts counting a load's allocations (see [`LoadMemory::allocating`]).
    pub(crate) fn load_memory(&self) -> LoadMemory {
        LoadMemory {
            created_before: self.counters().buffer_bytes_created,
        }
    }

    /// Makes every allocation scope that closes once more than `bytes` further bytes of buffers
    /// have been created report out-of-memory, as a device with only that much free memory
    /// would (`None` lifts it): for tests of what a load does when the GPU runs out, which no
    /// adapter can be made to do on demand.
    pub fn out_of_memory_past_for_test(&self, bytes: Option<u64>) {
        let at = match bytes {
            Some(b) => self.counters().buffer_bytes_created.saturating_add(b),
            None => u64::MAX,
        };
        self.simulated_memory.store(at, Ordering::Relaxed);
    }
}

impl LoadMemory {
    /// Watches the allocations made until [`Allocating::done`] for out-of-memory; `what` names
    /// them in the error.
    pub(crate) fn allocating(self, ctx: &GpuContext, what: impl Into<String>) -> Allocating {
        Allocating {
            scope: ctx.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory),
            what: what.into(),
            load: self,
        }
    }
}

impl Allocating {
    /// Closes the scope: [`Error::OutOfMemory`] if the device had no memory for an allocation
    /// made inside it. The returned future holds nothing of the device's thread.
    pub(crate) fn done(self, ctx: &GpuContext) -> impl std::future::Future<Output = Result<()>> {
        let popped = self.scope.pop();
        let created = ctx.counters().buffer_bytes_created;
        let simulated = created > ctx.simulated_memory.load(Ordering::Relaxed);
        let allocated = created.saturating_sub(self.load.created_before);
        let what = self.what;
        async move {
            let message = match popped.await {
                Some(e) => e.to_string(),
                None if simulated => "out of memory (a test's simulated device)".to_string(),
                None => return Ok(()),
            };
            Err(Error::OutOfMemory {
                what,
                allocated,
                message,
            })
        }
    }
}
