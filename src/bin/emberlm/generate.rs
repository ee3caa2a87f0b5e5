//! `emberlm generate` and `emberlm perplexity`.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use emberlm::chat::ChatMessage;
use emberlm::sampling::SamplingParams;
use emberlm::session::{Generation, Prompt};

use crate::cli::read_text;
use crate::sampling_args::SamplingArgs;
use crate::{load_engine, CliResult, Failure};

/// Flags of `emberlm generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// A GGUF file or a Hugging Face folder (default: the model in models/).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The prompt text.
    #[arg(
        long,
        conflicts_with = "prompt_file",
        required_unless_present = "prompt_file"
    )]
    pub prompt: Option<String>,
    /// Read the prompt from this file.
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// Recognise special tokens such as `<|im_start|>` in the prompt.
    #[arg(long)]
    pub special: bool,
    /// Treat the prompt as one user message and apply the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// A system message (with --chat).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Reject a prompt longer than the context instead of cutting it from the left.
    #[arg(long)]
    pub strict: bool,
    /// KV cache length (default: the model's context, at most 4096).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Print text as it is generated.
    #[arg(long)]
    pub stream: bool,
    /// Print one JSON object: prompt tokens, sequences, stats.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub format: crate::format_args::FormatArgs,
}

/// Flags of `emberlm perplexity`.
#[derive(Debug, Args)]
pub struct PerplexityArgs {
    /// A GGUF file or a Hugging Face folder (default: the model in models/).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The text file to score.
    #[arg(long)]
    pub file: PathBuf,
    /// Context window length (default: the model's context, at most 4096).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// JSON output: the default and only format (accepted for symmetry with `info`).
    #[arg(long)]
    pub json: bool,
}

/// The JSON form of a generation.
pub fn generation_json(g: &Generation) -> serde_json::Value {
    serde_json::json!({
        "prompt_tokens": g.prompt_tokens,
        "sequences": g.sequences.iter().map(|s| serde_json::json!({
            "tokens": s.tokens,
            "text": s.text,
            "finish_reason": s.finish_reason.as_str(),
            "logprob": s.logprob,
        })).collect::<Vec<_>>(),
        "stats": g.stats,
        "seed": g.seed,
        "warnings": g.warnings,
    })
}

pub fn generate(args: GenerateArgs) -> CliResult<()> {
    let params = args.sampling.apply(&SamplingParams::default())?;
    let text = match (&args.prompt, &args.prompt_file) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) => read_text(f)?,
        (None, None) => return Err(Failure::usage("give --prompt or --prompt-file")),
    };
    let prompt = if args.chat {
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::new("system", system.clone()));
        }
        messages.push(ChatMessage::new("user", text));
        Prompt::Chat(messages)
    } else {
        Prompt::Text(text)
    };
    let engine = load_engine(args.model, args.ctx)?;
    args.sampling.spec.load_draft(&engine)?;
    let options =
        args.sampling
            .options(params, args.special, args.strict, args.format.format()?)?;
    let stream = args.stream && !args.json;
    let several = options.sampling.num_return_sequences > 1;
    let mut current = 0usize;
    let mut on_token = |e: &emberlm::session::TokenEvent| {
        if !stream {
            return;
        }
        let mut out = std::io::stdout().lock();
        if several && e.sequence != current {
            current = e.sequence;
            let _ = writeln!(out);
        }
        let _ = out.write_all(e.text.as_bytes());
        let _ = out.flush();
    };
    let g = pollster::block_on(engine.generate(&prompt, &options, &mut on_token))?;
    for w in &g.warnings {
        eprintln!("emberlm: warning: {w}");
    }
    if args.json {
        println!("{}", generation_json(&g));
    } else if stream {
        println!();
    } else {
        for (i, s) in g.sequences.iter().enumerate() {
            if i > 0 {
                println!();
            }
            println!("{}", s.text);
        }
    }
    Ok(())
}

pub fn perplexity(args: PerplexityArgs) -> CliResult<()> {
    let text = read_text(&args.file)?;
    let engine = load_engine(args.model, args.ctx)?;
    let prompt = Prompt::Text(text);
    let tokens = pollster::block_on(engine.with_session(|s| s.tokenize_prompt(&prompt, false)))?;
    let score = pollster::block_on(engine.score(&tokens))?;
    println!(
        "{}",
        serde_json::json!({ "tokens": score.tokens, "nll": score.nll, "ppl": score.ppl })
    );
    Ok(())
}
