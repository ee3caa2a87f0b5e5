//! GPT-2: learned position embeddings, pre-norm blocks with LayerNorm, a stacked `c_attn`
//! projection with biases, no RoPE, and a GELU feed-forward.

use super::hf::{self, required, unsupported, HfConfig};
use super::{ArchSpec, Fusion, GgufName, HfFix, TensorVisitor, Window};
use crate::config::{Activation, Architecture, ModelConfig, NormKind, RopeLayout, RopeScaling};
use crate::error::{Error, Result};
use crate::model::graph::{Act, EmbedScale, Graph, LinearOp, Lookup, Matrix, Norm, Op, Post, Rows};

/// GPT-2: LayerNorm with bias, learned position embeddings, fused QKV with bias, GELU.
pub const ARCH: Architecture = Architecture::named("gpt2");

/// GPT-2.
pub static SPEC: ArchSpec = ArchSpec {
    arch: ARCH,
    gguf_names: &[GgufName {
        name: "gpt2",
        rope_layout: RopeLayout::None,
        qkv_bias: true,
        qk_norm: false,
    }],
    norm: NormKind::LayerNorm,
    gguf_eps_key: "attention.layer_norm_epsilon",
    activation: Activation::GeluTanh,
    window: Window::CapsContext,
    embedding_scale: EmbedScale::One,
    bidirectional: false,
    pooling: None,
    // Q, K and V are stored stacked already, and there is no gate
    fusion: Fusion {
        qkv: false,
        gate_up: false,
    },
    splits_stacked: false,
    hf_model_types: &["gpt2"],
    hf_config,
    hf_tensor,
    hf_fix: |_, hf_name| is_conv1d(hf_name).then_some(HfFix::Transpose),
    check,
    tensors,
    build,
};

/// The stacked `[3d, d]` projection holds Q, K and V each `d` wide: no grouped-query attention,
/// and the heads exactly cover the width.
fn check(c: &ModelConfig) -> Option<String> {
    if c.q_dim() != c.hidden_size {
        return Some(format!(
            "GPT-2 needs n_heads · head_dim = hidden_size, got {} · {} != {}",
            c.n_heads, c.head_dim, c.hidden_size
        ));
    }
    if c.n_kv_heads != c.n_heads {
        return Some(format!(
            "GPT-2 needs n_kv_heads = n_heads, got {} and {}",
            c.n_kv_heads, c.n_heads
        ));
    }
    None
}

/// GPT-2's `config.json`: the tanh GELU only; the feed-forward is `4·n_embd` unless given.
fn hf_config(raw: &HfConfig, file: &str) -> Result<ModelConfig> {
    let act = raw.activation_function.as_deref().unwrap_or("gelu_new");
    if !matches!(act, "gelu_new" | "gelu_pytorch_tanh") {
        return Err(unsupported(
            file,
            format!("activation_function `{act}` (only the tanh GELU: `gelu_new`)"),
        ));
    }
    let d = required(raw.n_embd, "n_embd", file)?;
    let heads = required(raw.n_head, "n_head", file)?;
    if heads == 0 {
        return Err(Error::format(file, "n_head is 0"));
    }
    Ok(ModelConfig {
        arch: ARCH,
        vocab_size: required(raw.vocab_size, "vocab_size", file)?,
        hidden_size: d,
        n_layers: required(raw.n_layer, "n_layer", file)?,
        n_heads: heads,
        n_kv_heads: heads,
        head_dim: d.checked_div(heads).unwrap_or(0),
        // an n_embd too large for 4·d is refused here, before the range checks see it
        ffn_size: match raw.n_inner {
            Some(n) => n,
            None => d.checked_mul(4).ok_or_else(|| {
                Error::format(
                    file,
                    format!("n_embd {d} is too large (4·n_embd overflows)"),
                )
            })?,
        },
        context_length: required(raw.n_positions, "n_positions", file)?,
        norm: NormKind::LayerNorm,
        norm_eps: raw.layer_norm_epsilon.unwrap_or(1e-5),
        rope_theta: 0.0,
        rope_layout: RopeLayout::None,
        rope_scaling: RopeScaling::None,
        activation: Activation::GeluTanh,
        tied_embeddings: raw.tie_word_embeddings.unwrap_or(true),
        qkv_bias: true,
        qk_norm: false,
        bos_id: None,
        eos_ids: Vec::new(),
        local_attention: None,
        bidirectional: false,
        pooling: None,
    })
}

/// GPT-2's Hugging Face tensor names (`transformer.` optional); its causal-mask buffers
/// (`attn.bias` without `.weight`) are not read.
fn hf_tensor(hf_name: &str) -> Option<String> {
    let n = hf_name.strip_prefix("transformer.").unwrap_or(hf_name);
    match n {
        "wte.weight" => return Some("token_embd.weight".into()),
        "wpe.weight" => return Some("position_embd.weight".into()),
        "ln_f.weight" => return Some("output_norm.weight".into()),
        "ln_f.bias" => return Some("output_norm.bias".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let (layer, rest) = hf::split_layer(n.strip_prefix("h.")?)?;
    let (module, suffix) = rest.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let gguf = match module {
        "ln_1" => "attn_norm",
        "attn.c_attn" => "attn_qkv",
        "attn.c_proj" => "attn_output",
        "ln_2" => "ffn_norm",
        "mlp.c_fc" => "ffn_up",
        "mlp.c_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{gguf}.{suffix}"))
}

/// GPT-2's Conv1D layers store `[in, out]`.
fn is_conv1d(hf_name: &str) -> bool {
    hf_name.ends_with(".weight")
        && ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
            .iter()
            .any(|m| hf_name.contains(m))
}

/// Token and position embeddings; per layer the LayerNorms, the stacked Q/K/V, the output
/// projection, up and down, each with its bias; then the head.
fn tensors(c: &ModelConfig, f: TensorVisitor<'_>) -> Result<()> {
    let (d, ff) = (c.hidden_size, c.ffn_size);
    f("token_embd.weight".into(), vec![c.vocab_size, d])?;
    f("position_embd.weight".into(), vec![c.context_length, d])?;
    for i in 0..c.n_layers {
        let b = |s: &str| format!("blk.{i}.{s}");
        f(b("attn_norm.weight"), vec![d])?;
        f(b("attn_norm.bias"), vec![d])?;
        f(b("attn_qkv.weight"), vec![3 * d, d])?;
        f(b("attn_qkv.bias"), vec![3 * d])?;
        f(b("attn_output.weight"), vec![d, d])?;
        f(b("attn_output.bias"), vec![d])?;
        f(b("ffn_norm.weight"), vec![d])?;
        f(b("ffn_norm.bias"), vec![d])?;
        f(b("ffn_up.weight"), vec![ff, d])?;
        f(b("ffn_up.bias"), vec![ff])?;
        f(b("ffn_down.weight"), vec![d, ff])?;
        f(b("ffn_down.bias"), vec![d])?;
    }
    super::head_tensors(c, f)
}

/// One block's weights.
#[derive(Debug)]
struct Block {
    /// LayerNorm before attention, weight and bias `[d]`.
    attn_norm: Norm,
    /// Stacked Q, K, V projection (`c_attn`), `[3·d, d]`, bias `[3·d]`.
    attn_qkv: Matrix,
    /// Attention output projection (`c_proj`), `[d, d]`, bias `[d]`.
    attn_output: Matrix,
    /// LayerNorm before the feed-forward, weight and bias `[d]`.
    ffn_norm: Norm,
    /// Feed-forward up projection (`c_fc`), `[ffn, d]`, bias `[ffn]`.
    ffn_up: Matrix,
    /// Feed-forward down projection (`c_proj`), `[d, ffn]`, bias `[d]`.
    ffn_down: Matrix,
}

impl Block {
    /// Layer `layer`'s weights, shapes checked.
    fn find(c: &ModelConfig, w: &Lookup<'_>, layer: usize) -> Result<Self> {
        let b = |s: &str| format!("blk.{layer}.{s}");
        let (d, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.ffn_size);
        Ok(Self {
            attn_norm: w.norm(c, &b("attn_norm"), d)?,
            attn_qkv: w.matrix(&b("attn_qkv"), q + 2 * kv, d)?,
            attn_output: w.matrix(&b("attn_output"), d, q)?,
            ffn_norm: w.norm(c, &b("ffn_norm"), d)?,
            ffn_up: w.matrix(&b("ffn_up"), ff, d)?,
            ffn_down: w.matrix(&b("ffn_down"), d, ff)?,
        })
    }

    /// The block's operations, residual stream in [`Act::X`].
    fn ops(self, layer: usize, ops: &mut Vec<Op>) {
        let mut qkv = LinearOp::new(self.attn_qkv, Act::X, Act::Q).normed(&self.attn_norm);
        qkv.kv_layer = Some(layer);
        ops.push(Op::Linear(qkv));
        ops.push(Op::Attention {
            layer,
            stacked: true,
        });
        ops.push(Op::Linear(
            LinearOp::new(self.attn_output, Act::Attn, Act::X).residual(),
        ));
        ops.push(Op::Linear(
            LinearOp::new(self.ffn_up, Act::X, Act::Hidden)
                .normed(&self.ffn_norm)
                .then(Post::Gelu),
        ));
        ops.push(Op::Linear(
            LinearOp::new(self.ffn_down, Act::Hidden, Act::X).residual(),
        ));
    }
}

/// The graph of a GPT-2 model.
fn build(c: &ModelConfig, w: &Lookup<'_>) -> Result<Graph> {
    let d = c.hidden_size;
    let mut ops = vec![
        Op::Embed {
            table: w.tensor("token_embd.weight", &[c.vocab_size, d])?,
            rows: Rows::Tokens,
            accumulate: false,
            scale: SPEC.embedding_scale,
        },
        Op::Embed {
            table: w.tensor("position_embd.weight", &[c.context_length, d])?,
            rows: Rows::Positions,
            accumulate: true,
            scale: SPEC.embedding_scale,
        },
    ];
    for layer in 0..c.n_layers {
        Block::find(c, w, layer)?.ops(layer, &mut ops);
    }
    let head = crate::model::graph::head(c, w)?;
    Ok(Graph { ops, head })
}
