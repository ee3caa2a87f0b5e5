//! Building a [`CpuForward`]: from weights whose files are held (a mapped file, or bytes read
//! whole: the matrices borrow their ranges), or from a model read a group of tensors at a time
//! ([`TensorReader`]: a `File` or a stored download in the page), where each matrix becomes
//! the backend's own as it arrives (in tiles where the CPU multiplies in tiles) and the files
//! are never held whole.

use std::collections::HashMap;
use std::ops::Range;

use super::{CpuForward, CpuKv, CpuWeights};
use crate::backend::cpu::{CpuPrecision, QMatrix};
use crate::backend::readback::MemoryReport;
use crate::config::{KvLayout, ModelConfig};
use crate::dtype::dequantize;
use crate::dtype::kv::KvKinds;
use crate::error::{Error, Result};
use crate::model::byte_source::{read_groups, TensorReader};
use crate::model::file_bytes::{FileBytes, WeightBytes};
use crate::model::weights::{ModelWeights, Tensor};

/// A file range a matrix kept as stored still reads after loading.
type StillRead = (FileBytes, Range<usize>);

impl CpuWeights {
    fn empty() -> Self {
        Self {
            mats: HashMap::new(),
            vecs: HashMap::new(),
            shapes: HashMap::new(),
        }
    }

    /// Takes tensor `name` (`shape`, `dtype`) in: a matrix from `kept` (its bytes as the
    /// backend keeps them), anything else dequantized to f32 from `data`. Gives the file range
    /// a matrix kept as stored still reads (none for one in tiles or with bytes of its own).
    fn hold(
        &mut self,
        name: &str,
        t: &Tensor<'_>,
        kept: impl FnOnce() -> WeightBytes,
        precision: CpuPrecision,
    ) -> Result<Option<StillRead>> {
        self.shapes.insert(name.to_string(), t.shape.clone());
        let &[rows, cols] = t.shape.as_slice() else {
            let v = dequantize(t.dtype, &t.data, t.n_elements() as u64, name)?;
            self.vecs.insert(name.to_string(), v);
            return Ok(None);
        };
        let kept = kept();
        let range = kept.file_range();
        let m = QMatrix::with_precision(t.dtype, rows, cols, kept, name, precision)?;
        let still = range.filter(|_| !m.is_tiled());
        self.mats.insert(name.to_string(), m);
        Ok(still)
    }
}

impl CpuForward {
    /// [`Self::with_precision`] with the KV cache stored in `kinds` from the start (never an
    /// f32 cache first: in WebAssembly memory grown for one is never given back).
    pub fn with_kinds(
        weights: &ModelWeights<'_>,
        context: usize,
        chunk: usize,
        precision: CpuPrecision,
        kinds: KvKinds,
    ) -> Result<Self> {
        let chunk = Self::check_load(weights, context, chunk, kinds)?;
        let mut held = CpuWeights::empty();
        // the file ranges still read after loading: the matrices kept as stored
        let mut still_read = Vec::new();
        for (name, t) in &weights.tensors {
            let kept = || weights.keep(&t.data);
            still_read.extend(held.hold(name, t, kept, precision)?);
        }
        // Every page of the files but the stored matrices' handed back: where the system
        // keeps a file in large pages (2 MiB straddling tensors), reading one tensor (a norm,
        // a matrix being repacked) maps its neighbours' pages too, released or not, so 0.05–0.31
        // GB of the 3B shape's file stayed resident that nothing reads again.
        release_all_but(&weights.sources, still_read);
        Self::finish(
            weights.config.clone(),
            &weights.file,
            held,
            context,
            chunk,
            precision,
            kinds,
        )
    }

    /// [`Self::with_kinds`] for the model `layout` describes (tensors without bytes), whose
    /// tensors `reader` reads a group at a time ([`read_groups`]): each matrix is the
    /// backend's own from the bytes read (in tiles where the CPU has them, the bytes read then
    /// dropped), so what is held at once is the weights as kept and one group of tensors, never
    /// the files. Calls `progress(read, total)` in weight bytes as the groups come.
    pub async fn load_read(
        layout: &ModelWeights<'_>,
        reader: &dyn TensorReader,
        context: usize,
        chunk: usize,
        precision: CpuPrecision,
        kinds: KvKinds,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let chunk = Self::check_load(layout, context, chunk, kinds)?;
        let mut held = CpuWeights::empty();
        let total = layout.weight_bytes();
        let mut done = 0u64;
        progress(0, total);
        for (_, names) in read_groups(layout) {
            for (name, t) in reader.read_tensors(&names).await? {
                done = done.saturating_add(t.data.len() as u64);
                if t.shape.len() != 2 {
                    held.hold(&name, &t, || WeightBytes::Owned(Vec::new()), precision)?;
                    continue;
                }
                // the bytes read become the matrix's own, without a copy
                let Tensor { shape, dtype, data } = t;
                let described = Tensor {
                    shape,
                    dtype,
                    data: Default::default(),
                };
                let kept = || WeightBytes::Owned(data.into_owned());
                held.hold(&name, &described, kept, precision)?;
            }
            progress(done.min(total), total);
        }
        progress(total, total);
        Self::finish(
            layout.config.clone(),
            &layout.file,
            held,
            context,
            chunk,
            precision,
            kinds,
        )
    }

    /// Checks what a load needs before anything is held: the architecture, the tensors'
    /// shapes, the context, and in WebAssembly the address space. Gives the tokens per step.
    fn check_load(
        weights: &ModelWeights<'_>,
        context: usize,
        chunk: usize,
        kinds: KvKinds,
    ) -> Result<usize> {
        crate::model::arch::validate(&weights.config, &weights.file)?;
        weights.check_shapes()?;
        crate::backend::step::check_context(&weights.config, context)?;
        if chunk == 0 {
            return Err(Error::invalid("chunk", "must be at least 1"));
        }
        super::check_address_space(weights, context, kinds)?;
        Ok(crate::backend::step::step_tokens(
            &weights.config,
            context,
            chunk,
        ))
    }

    /// The model over `held`: its graph, RoPE frequencies and a KV cache of `context`
    /// positions in `kinds`.
    fn finish(
        config: ModelConfig,
        file: &str,
        held: CpuWeights,
        context: usize,
        chunk: usize,
        precision: CpuPrecision,
        kinds: KvKinds,
    ) -> Result<Self> {
        let graph = crate::model::arch::build(&config, &held, file)?;
        let freqs = (0..config.n_layers)
            .map(|l| config.layer_rope(l).frequencies(config.head_dim))
            .collect();
        let kv = CpuKv::new(
            &config,
            kinds,
            KvLayout::trained(&config, context, chunk),
            1,
        )?;
        let weight_bytes = held.mats.values().map(|m| m.bytes() as u64).sum::<u64>()
            + held.vecs.values().map(|v| v.len() as u64 * 4).sum::<u64>();
        let memory = MemoryReport {
            weights: weight_bytes,
            kv_cache: kv.bytes(),
            activations: 0,
            kv_bytes_per_token: kv.layout.position_bytes(kinds.row_bytes(config.kv_dim())),
            batch: 0,
        };
        Ok(Self {
            config,
            chunk,
            graph,
            weights: held,
            kv,
            freqs,
            logits: Vec::new(),
            memory,
            precision,
        })
    }
}

/// Hands back to the system the pages of `files` (mapped ones; nothing for bytes in memory)
/// outside `kept` (ranges of those files).
fn release_all_but(files: &[FileBytes], mut kept: Vec<StillRead>) {
    kept.sort_by_key(|(_, r)| r.start);
    for file in files {
        let mut from = 0;
        for (_, r) in kept.iter().filter(|(f, _)| f.same_as(file)) {
            file.release(from..r.start.max(from));
            from = from.max(r.end);
        }
        file.release(from..file.len());
    }
}
