//! Engine counters: what the engine asked of the GPU (dispatches, passes, submits, readbacks,
//! allocations), counted in its own wrappers so the figures are exact and adapter-independent.
//!
//! The cells are atomics (relaxed: each is an independent tally), so they work unchanged on
//! wasm32 and from any thread natively. [`GpuContext::counters`](super::GpuContext::counters) takes a [`Counters`] snapshot;
//! [`Counters::since`] gives what happened between two snapshots.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// The live tallies, shared by the context and the structures that record or own GPU work.
#[derive(Debug, Default)]
pub struct CounterCells {
    dispatches: AtomicU64,
    compute_passes: AtomicU64,
    command_buffers: AtomicU64,
    submits: AtomicU64,
    readback_waits: AtomicU64,
    readback_bytes: AtomicU64,
    buffers_created: AtomicU64,
    buffer_bytes_created: AtomicU64,
    buffers_alive: AtomicI64,
    buffer_bytes_alive: AtomicI64,
    bind_groups_created: AtomicU64,
    pipelines_created: AtomicU64,
    weight_bytes_bound: AtomicU64,
    forward_steps: AtomicU64,
    forward_tokens: AtomicU64,
}

fn add(cell: &AtomicU64, n: u64) {
    cell.fetch_add(n, Ordering::Relaxed);
}

impl CounterCells {
    /// One compute dispatch that binds `weight_bytes` bytes of model weights.
    pub(crate) fn dispatch(&self, weight_bytes: u64) {
        add(&self.dispatches, 1);
        add(&self.weight_bytes_bound, weight_bytes);
    }

    /// One compute pass begun.
    pub(crate) fn compute_pass(&self) {
        add(&self.compute_passes, 1);
    }

    /// `command_buffers` command buffers handed to one `queue.submit`.
    pub(crate) fn submit(&self, command_buffers: u64) {
        add(&self.submits, 1);
        add(&self.command_buffers, command_buffers);
    }

    /// One wait for a mapped buffer of `bytes` bytes.
    pub(crate) fn readback(&self, bytes: u64) {
        add(&self.readback_waits, 1);
        add(&self.readback_bytes, bytes);
    }

    /// One buffer of `bytes` bytes created.
    pub(crate) fn buffer_created(&self, bytes: u64) {
        add(&self.buffers_created, 1);
        add(&self.buffer_bytes_created, bytes);
    }

    /// One bind group created.
    pub(crate) fn bind_group(&self) {
        add(&self.bind_groups_created, 1);
    }

    /// One compute pipeline built.
    pub(crate) fn pipeline(&self) {
        add(&self.pipelines_created, 1);
    }

    /// One forward step of `tokens` tokens.
    pub(crate) fn forward_step(&self, tokens: u64) {
        add(&self.forward_steps, 1);
        add(&self.forward_tokens, tokens);
    }

    fn alive(&self, count: i64, bytes: i64) {
        self.buffers_alive.fetch_add(count, Ordering::Relaxed);
        self.buffer_bytes_alive.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Counters {
        let u = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let i = |c: &AtomicI64| c.load(Ordering::Relaxed);
        Counters {
            dispatches: u(&self.dispatches),
            compute_passes: u(&self.compute_passes),
            command_buffers: u(&self.command_buffers),
            submits: u(&self.submits),
            readback_waits: u(&self.readback_waits),
            readback_bytes: u(&self.readback_bytes),
            buffers_created: u(&self.buffers_created),
            buffer_bytes_created: u(&self.buffer_bytes_created),
            buffers_alive: i(&self.buffers_alive),
            buffer_bytes_alive: i(&self.buffer_bytes_alive),
            bind_groups_created: u(&self.bind_groups_created),
            pipelines_created: u(&self.pipelines_created),
            weight_bytes_bound: u(&self.weight_bytes_bound),
            forward_steps: u(&self.forward_steps),
            forward_tokens: u(&self.forward_tokens),
        }
    }
}

/// Keeps buffers counted as alive while its owner (weights, KV cache, activations, a kernel's
/// parameters, a staging buffer) holds them; dropping it counts them gone.
#[derive(Debug)]
pub struct AliveBuffers {
    cells: Arc<CounterCells>,
    count: i64,
    bytes: i64,
}

impl AliveBuffers {
    /// Counts buffers of the given sizes as alive until this value is dropped.
    pub(crate) fn new(cells: &Arc<CounterCells>, sizes: impl IntoIterator<Item = u64>) -> Self {
        let mut this = Self {
            cells: Arc::clone(cells),
            count: 0,
            bytes: 0,
        };
        this.extend(sizes);
        this
    }

    /// Adds more buffers to the set.
    pub(crate) fn extend(&mut self, sizes: impl IntoIterator<Item = u64>) {
        let (mut count, mut bytes) = (0i64, 0i64);
        for s in sizes {
            count += 1;
            bytes += i64::try_from(s).unwrap_or(i64::MAX);
        }
        self.cells.alive(count, bytes);
        self.count += count;
        self.bytes += bytes;
    }

    /// Bytes of the buffers counted.
    pub fn bytes(&self) -> u64 {
        self.bytes.max(0) as u64
    }
}

impl Drop for AliveBuffers {
    fn drop(&mut self) {
        self.cells.alive(-self.count, -self.bytes);
    }
}

/// A snapshot of the engine counters (totals since the context was created, or a difference
/// from [`Counters::since`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Compute dispatches recorded.
    pub dispatches: u64,
    /// Compute passes begun.
    pub compute_passes: u64,
    /// Command buffers submitted.
    pub command_buffers: u64,
    /// `queue.submit` calls.
    pub submits: u64,
    /// Waits for a mapped buffer (`map_async` + wait), i.e. GPU→CPU syncs.
    pub readback_waits: u64,
    /// Bytes copied from GPU to CPU.
    pub readback_bytes: u64,
    /// Buffers created through the engine.
    pub buffers_created: u64,
    /// Their bytes.
    pub buffer_bytes_created: u64,
    /// Buffers held by the engine's structures now (a difference from `since` may be negative).
    pub buffers_alive: i64,
    /// Their bytes.
    pub buffer_bytes_alive: i64,
    /// Bind groups created.
    pub bind_groups_created: u64,
    /// Compute pipelines built (cache misses of the kernel cache).
    pub pipelines_created: u64,
    /// Model weight bytes bound by the dispatches recorded: whole matrices for linear layers,
    /// the rows gathered for embedding lookups.
    pub weight_bytes_bound: u64,
    /// Forward steps (a prefill chunk or one decode token each).
    pub forward_steps: u64,
    /// Tokens those steps processed.
    pub forward_tokens: u64,
}

impl Counters {
    /// What happened between `earlier` and `self` (both snapshots of the same context).
    pub fn since(&self, earlier: &Counters) -> Counters {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        Counters {
            dispatches: d(self.dispatches, earlier.dispatches),
            compute_passes: d(self.compute_passes, earlier.compute_passes),
            command_buffers: d(self.command_buffers, earlier.command_buffers),
            submits: d(self.submits, earlier.submits),
            readback_waits: d(self.readback_waits, earlier.readback_waits),
            readback_bytes: d(self.readback_bytes, earlier.readback_bytes),
            buffers_created: d(self.buffers_created, earlier.buffers_created),
            buffer_bytes_created: d(self.buffer_bytes_created, earlier.buffer_bytes_created),
            buffers_alive: self.buffers_alive - earlier.buffers_alive,
            buffer_bytes_alive: self.buffer_bytes_alive - earlier.buffer_bytes_alive,
            bind_groups_created: d(self.bind_groups_created, earlier.bind_groups_created),
            pipelines_created: d(self.pipelines_created, earlier.pipelines_created),
            weight_bytes_bound: d(self.weight_bytes_bound, earlier.weight_bytes_bound),
            forward_steps: d(self.forward_steps, earlier.forward_steps),
            forward_tokens: d(self.forward_tokens, earlier.forward_tokens),
        }
    }

    /// Each counter divided by `n` (per token, per step); `alive` fields are kept as they are.
    pub fn per(&self, n: u64) -> CountersPer {
        let n = n.max(1) as f64;
        let f = |v: u64| v as f64 / n;
        CountersPer {
            dispatches: f(self.dispatches),
            compute_passes: f(self.compute_passes),
            command_buffers: f(self.command_buffers),
            submits: f(self.submits),
            readback_waits: f(self.readback_waits),
            readback_bytes: f(self.readback_bytes),
            buffers_created: f(self.buffers_created),
            bind_groups_created: f(self.bind_groups_created),
            pipelines_created: f(self.pipelines_created),
            weight_bytes_bound: f(self.weight_bytes_bound),
            buffers_alive_change: self.buffers_alive,
            buffer_bytes_alive_change: self.buffer_bytes_alive,
        }
    }
}

/// Counters averaged over a number of tokens or steps (see [`Counters::per`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CountersPer {
    /// Compute dispatches.
    pub dispatches: f64,
    /// Compute passes.
    pub compute_passes: f64,
    /// Command buffers.
    pub command_buffers: f64,
    /// `queue.submit` calls.
    pub submits: f64,
    /// GPU→CPU waits.
    pub readback_waits: f64,
    /// Bytes read back.
    pub readback_bytes: f64,
    /// Buffers created.
    pub buffers_created: f64,
    /// Bind groups created.
    pub bind_groups_created: f64,
    /// Pipelines built.
    pub pipelines_created: f64,
    /// Weight bytes bound.
    pub weight_bytes_bound: f64,
    /// Change of the buffers alive over the whole span (not divided).
    pub buffers_alive_change: i64,
    /// Change of their bytes over the whole span (not divided).
    pub buffer_bytes_alive_change: i64,
}
