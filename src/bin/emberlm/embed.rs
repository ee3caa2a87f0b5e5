//! `emberlm embed`: texts embedded by the loaded model (its final hidden states pooled, see
//! `Session::embed`), one JSON line per text, in input order.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use emberlm::session::{EmbedOptions, Pooling};

use crate::cli::read_text;
use crate::{load_engine, CliResult, Failure};

/// `emberlm embed`'s arguments.
#[derive(Args, Debug)]
pub struct EmbedArgs {
    /// A GGUF file or a Hugging Face folder (default: the model in models/).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// A text to embed (repeat for several).
    #[arg(long)]
    pub text: Vec<String>,
    /// A file of texts, one per line (blank lines skipped).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// How token states are pooled: mean, last or cls (default: the model's own where its
    /// file names one, else mean).
    #[arg(long)]
    pub pooling: Option<String>,
    /// Keep the pooled vectors as they are instead of scaling them to unit length.
    #[arg(long)]
    pub no_normalize: bool,
    /// Context window length (default: the model's context, at most 4096).
    #[arg(long)]
    pub ctx: Option<usize>,
}

/// Prints `{"index", "tokens", "embedding"}` for every text of `--text` then `--file`.
pub fn embed(args: EmbedArgs) -> CliResult<()> {
    let options = EmbedOptions {
        pooling: args
            .pooling
            .as_deref()
            .map(Pooling::parse)
            .transpose()
            .map_err(|e| Failure::usage(format!("--pooling: {e}")))?,
        normalize: !args.no_normalize,
    };
    let mut texts = args.text;
    if let Some(file) = &args.file {
        let content = read_text(file)?;
        texts.extend(
            content
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_string),
        );
    }
    if texts.is_empty() {
        return Err(Failure::usage(
            "nothing to embed: give --text TEXT or --file FILE",
        ));
    }
    let engine = load_engine(args.model, args.ctx)?;
    // every text is checked before any runs, so an error names its index in the input
    let embeddings = pollster::block_on(engine.embed(&texts, &options))?;
    let mut out = std::io::stdout().lock();
    for (i, (v, tokens)) in embeddings
        .vectors
        .iter()
        .zip(&embeddings.tokens)
        .enumerate()
    {
        let line = serde_json::json!({ "index": i, "tokens": tokens, "embedding": v });
        writeln!(out, "{line}").map_err(|e| Failure::usage(format!("stdout: {e}")))?;
    }
    Ok(())
}
