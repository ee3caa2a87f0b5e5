//! Browser tests (wasm-bindgen-test in headless Chromium on WebGPU; SwiftShader in CI): the
//! adapter, deterministic reductions, device loss and loading a model from bytes. A missing
//! WebGPU adapter fails.

#![cfg(target_arch = "wasm32")]

use crate::common;

use common::browser_log as log;

use common::kernel_cases::{self, reductions};
use wasm_bindgen_test::wasm_bindgen_test;

#[wasm_bindgen_test]
async fn adapter_is_webgpu() {
    let ctx = common::browser_gpu().await;
    let report = ctx.report();
    assert_eq!(report.backend, "webgpu", "{report:?}");
    assert!(
        report.limits.max_storage_buffer_binding_size >= 128 << 20,
        "{report:?}"
    );
}

#[wasm_bindgen_test]
async fn reductions_are_deterministic() {
    let (ctx, cache) = common::shared_browser_gpu().await;
    let mut rng = common::rng("determinism (browser)", &log);
    for reduction in reductions(ctx) {
        kernel_cases::check_linear_deterministic(ctx, cache, reduction, &mut rng)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

#[wasm_bindgen_test]
async fn device_loss_is_an_error_not_a_panic() {
    let ctx = common::browser_gpu().await;
    let buf = ctx.storage_from("data", &[1.0f32, 2.0]).unwrap();
    assert_eq!(ctx.read_f32(&buf, 2).await.unwrap(), [1.0, 2.0]);
    ctx.destroy_for_test();
    let err = ctx
        .read_f32(&buf, 2)
        .await
        .expect_err("a destroyed device reads nothing");
    assert!(matches!(err, emberlm::Error::DeviceLost { .. }), "{err}");
}

#[wasm_bindgen_test]
fn gguf_loads_from_bytes_and_from_a_stream() {
    use emberlm::dtype::{dequantize, DType};
    use emberlm::format::gguf_stream::GgufStream;
    use emberlm::loader::ModelFiles;

    let bytes: &[u8] = include_bytes!("../fixtures/tiny-llama-q4_1.gguf");
    let files = ModelFiles::from_bytes(bytes.to_vec(), "tiny-llama-q4_1.gguf").unwrap();
    let w = files.weights().unwrap();
    assert_eq!((w.config.n_layers, w.config.vocab_size), (2, 512));
    let embd = w.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.dtype, DType::Q4_1);
    let values = dequantize(embd.dtype, &embd.data, embd.n_elements() as u64, "embd").unwrap();
    assert!(values.iter().all(|v| v.is_finite()) && values.iter().any(|&v| v != 0.0));

    let mut s = GgufStream::new("tiny-llama-q4_1.gguf", bytes.len() as u64);
    let mut tensors = 0;
    for chunk in bytes.chunks(10_000) {
        s.push(chunk, |_, _, _| {
            tensors += 1;
            Ok(())
        })
        .unwrap();
    }
    assert_eq!(s.finish().unwrap().tensors().len(), tensors);
    log(&format!(
        "browser: tiny-llama-q4_1.gguf streamed, {tensors} tensors"
    ));
}
