//! Who writes a KV cache of each kind on the GPU (lavapipe): the stacked Q/K/V projection
//! encodes every kind itself when its rows come in whole 32-value blocks, and a store dispatch
//! per layer follows it when they do not; either way the cached words are the CPU encoder's
//! (`emberlm::dtype::kv`). The kind-by-kind kernels and whole-model quality checks are in
//! `tests/gpu/kv_kinds.rs`.
//!
//! Without an adapter these tests print why and pass, unless `EMBERLM_REQUIRE_GPU=1` is set
//! (as `./build.sh test` does), in which case they fail.

#![cfg(not(target_arch = "wasm32"))]

use crate::common;

use std::path::PathBuf;

use emberlm::backend::gpu::Forward;
use emberlm::backend::gpu::{KernelCache, KernelOverrides};
use emberlm::dtype::kv::{KvKind, KvKinds};
use emberlm::loader::ModelFiles;
use emberlm::GpuOptions;

/// Runs 13 tokens of the model at `path` (a 9-token prefill step, then decode steps) with
/// caches of `kinds` in the kernel shape `variant`: the forward pass's node count and every
/// layer's K caches, then V caches, as words (the first 13 positions; the longer row of the
/// two kinds). `None` without an adapter.
fn cached_words(
    path: &std::path::Path,
    kinds: KvKinds,
    variant: emberlm::backend::gpu::Variant,
) -> Option<(usize, Vec<Vec<u32>>)> {
    let files = ModelFiles::open(path).unwrap();
    let weights = files.weights().unwrap();
    let kv_dim = weights.config.kv_dim();
    let tokens: Vec<u32> = (0..13u32).map(|i| (i * 37 + 11) % 500).collect();
    let options = GpuOptions {
        kv_cache: kinds,
        kernels: KernelOverrides::all(variant),
        ..GpuOptions::default()
    };
    let ctx = common::native_gpu(options)?;
    let cache = KernelCache::new();
    let mut fwd = pollster::block_on(Forward::new(&ctx, &cache, &weights, 32, 16)).unwrap();
    pollster::block_on(fwd.forward(&ctx, &tokens[..9], false)).unwrap();
    for &t in &tokens[9..] {
        pollster::block_on(fwd.forward(&ctx, &[t], false)).unwrap();
    }
    let row_words = kinds.k.row_words(kv_dim).max(kinds.v.row_words(kv_dim));
    let bytes = row_words as u64 * 4 * tokens.len() as u64;
    let caches = fwd
        .kv()
        .k
        .iter()
        .chain(&fwd.kv().v)
        .map(|b| {
            let bytes = pollster::block_on(ctx.read_bytes(b, bytes)).unwrap();
            bytemuck::pod_collect_to_vec(&bytes)
        })
        .collect();
    ctx.check().expect("no GPU error along the way");
    Some((fwd.node_count(), caches))
}

/// Checks the model at `path` with each of `kinds` against its f32 cache in both kernel
/// shapes: the node count is the f32 cache's plus `extra_nodes` (store dispatches), and every
/// word the first layer caches (whose inputs the cache kind cannot change) is the CPU
/// encoder's encoding of what the f32 cache holds there.
fn check_first_layer_encoding(path: &std::path::Path, kinds_list: &[KvKinds], extra_nodes: usize) {
    use emberlm::backend::gpu::Variant;
    let files = ModelFiles::open(path).unwrap();
    let config = files.weights().unwrap().config;
    let (layers, kv_dim) = (config.n_layers, config.kv_dim());
    for variant in Variant::EVERY_FAMILY {
        let Some((f32_nodes, f32_rows)) = cached_words(path, KvKinds::default(), variant) else {
            return;
        };
        for &kinds in kinds_list {
            let (nodes, words) = cached_words(path, kinds, variant).unwrap();
            assert_eq!(nodes, f32_nodes + extra_nodes, "{variant} {kinds:?}: nodes");
            // the first layer's K, then its V
            for (cache, kind) in [(0, kinds.k), (layers, kinds.v)] {
                let (values, words) = (&f32_rows[cache], &words[cache]);
                for (p, row) in values.chunks_exact(kv_dim).enumerate() {
                    let row: Vec<f32> = row.iter().map(|&w| f32::from_bits(w)).collect();
                    let want = kind.encode_row(&row);
                    let got = &words[p * want.len()..][..want.len()];
                    assert_eq!(
                        got,
                        want.as_slice(),
                        "{variant} {kinds:?}: cache {cache} position {p}"
                    );
                }
            }
        }
    }
}

/// Caches of every kind are written by the stacked Q/K/V projection itself, in both kernel
/// shapes and through prefill and decode steps: no store dispatch follows it (the model's
/// query and key/value rows come in whole 32-value blocks), and the first layer's words are
/// the CPU encoder's.
#[test]
fn the_qkv_projection_writes_every_kind_itself() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama-f32.gguf");
    let pair = |k, v| KvKinds { k, v };
    let kinds = [
        KvKinds::both(KvKind::F16),
        KvKinds::both(KvKind::Q8_0),
        pair(KvKind::Q4_0, KvKind::Nf4),
        pair(KvKind::F32, KvKind::F16),
    ];
    check_first_layer_encoding(&path, &kinds, 0);
}

/// Key/value rows that split a 32-value block (one KV head of 16 values) cannot be encoded by
/// the projection's workgroups: the block kinds and mixed kinds take one store dispatch per
/// layer, f16 still none, and the words are the CPU encoder's all the same.
#[test]
fn rows_that_split_blocks_take_the_store_dispatch() {
    use common::model_forms::{tiny_llama_tensors, write_folder};
    let mut tensors = tiny_llama_tensors();
    // keep the first KV head (16 rows) of every K and V projection
    for (name, (shape, values)) in tensors.iter_mut() {
        if name.ends_with("k_proj.weight") || name.ends_with("v_proj.weight") {
            let cols = shape[1];
            shape[0] = 16;
            values.truncate(16 * cols);
        }
    }
    let dir = std::env::temp_dir().join(format!("emberlm-kv-split-{}", std::process::id()));
    write_folder(&tensors, &dir, |c| {
        c.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 1")
    });
    let layers = ModelFiles::open(&dir)
        .unwrap()
        .weights()
        .unwrap()
        .config
        .n_layers;
    let pair = |k, v| KvKinds { k, v };
    check_first_layer_encoding(
        &dir,
        &[KvKinds::both(KvKind::Q8_0), pair(KvKind::Nf4, KvKind::F16)],
        layers,
    );
    check_first_layer_encoding(&dir, &[KvKinds::both(KvKind::F16)], 0);
    let _ = std::fs::remove_dir_all(&dir);
}
