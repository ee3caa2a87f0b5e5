//! `emberlm profile`: where one decode step and one prefill chunk spend their time, per kernel,
//! under the model's kernel plan.

use std::path::PathBuf;

use clap::Args;
use emberlm::backend::gpu::KernelCache;
use emberlm::backend::gpu::{Forward, StepProfile};
use emberlm::backend::DEFAULT_CHUNK;
use emberlm::config::default_context;
use emberlm::loader::ModelFiles;
use emberlm::GpuContext;

use crate::{CliResult, Failure};

/// Arguments of `emberlm profile`.
#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// A GGUF file or a Hugging Face folder (default: the model in models/).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Tokens of the profiled prefill chunk (at most one chunk, 64).
    #[arg(long, default_value_t = 32)]
    prompt_tokens: u32,
    /// Position of the profiled decode step (cached tokens before it).
    #[arg(long, default_value_t = 32)]
    decode_pos: u32,
    /// KV cache length (default: the model's context, at most 4096).
    #[arg(long)]
    ctx: Option<usize>,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

fn table(title: &str, p: &StepProfile) {
    println!(
        "\n{title}: {} token(s) at position {}: step {:.3} ms (kernels alone {:.3} ms)",
        p.n_tokens,
        p.pos0,
        p.step_seconds * 1e3,
        p.kernels_seconds * 1e3
    );
    println!(
        "{:<34} {:<22} {:>9} {:>5} {:>10} {:>7} {:>10}",
        "kernel", "shape", "variant", "count", "ms/step", "share", "MB read"
    );
    for r in &p.rows {
        let share = r.seconds / p.kernels_seconds.max(1e-12) * 100.0;
        let variant = r.variant.map_or("-".to_string(), |v| v.to_string());
        println!(
            "{:<34} {:<22} {:>9} {:>5} {:>10.3} {:>6.1}% {:>10.2}",
            r.kernel,
            r.shape,
            variant,
            r.count,
            r.seconds * 1e3,
            share,
            r.bytes as f64 / 1e6
        );
    }
}

/// Runs `emberlm profile`.
pub fn profile(args: ProfileArgs) -> CliResult<()> {
    let ctx = crate::cli::context(args.ctx);
    if ctx == Some(0) {
        return Err(Failure::usage("--ctx must be at least 1"));
    }
    let files = ModelFiles::open(&crate::cli::model_path(args.model)?)?;
    let weights = files.weights()?;
    let context = ctx.unwrap_or_else(|| default_context(&weights.config));
    let gpu = pollster::block_on(GpuContext::new(crate::cli::gpu_options()))?;
    let cache = KernelCache::new();
    let mut fwd = pollster::block_on(Forward::new(&gpu, &cache, &weights, context, DEFAULT_CHUNK))?;
    let profile = pollster::block_on(fwd.profile(&gpu, args.decode_pos, args.prompt_tokens))?;
    if args.json {
        let out = serde_json::json!({
            "model": files.name(),
            "adapter": gpu.report().name,
            "profile": profile,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("model:   {}", files.name());
    println!("adapter: {}", gpu.report());
    println!("kernel plan:");
    for line in profile.plan.describe() {
        println!("  {line}");
    }
    if let Some(at) = &profile.plan.stored_at {
        println!("  stored at {at}");
    }
    table("decode", &profile.decode);
    table("prefill", &profile.prefill);
    Ok(())
}
