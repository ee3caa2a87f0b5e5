//! `emberlm batch`: generation for every prompt of a file, results in input order.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use emberlm::chat::ChatMessage;
use emberlm::sampling::SamplingParams;
use emberlm::session::{BatchItem, GenerateOptions, Generation, GivenOptions, Prompt};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::read_text;
use crate::generate::generation_json;
use crate::sampling_args::SamplingArgs;
use crate::{load_engine, CliResult, Failure};

/// How the input file is read, for `emberlm batch --help`.
const INPUT_HELP: &str = "\
Input (--prompts FILE), one prompt per line:
  - a plain line is the prompt text;
  - a line starting with `{` is a JSON object: {\"prompt\": \"...\", ...} where the other
    fields are generation options under their JSON names (snake_case or camelCase, e.g.
    \"temperature\", \"top_p\", \"maxNewTokens\", \"seed\", \"stop\",
    \"response_format\"); they replace the flags' values for that prompt. A prompt that starts with `{` must be written as JSON.
  - blank lines are skipped; line numbers in messages count every line of the file.
Every line is checked before anything is generated: a bad line stops the run with exit
status 2 and a message naming the line and the option.

Output, in input order: with --jsonl one JSON object per line
  {\"index\", \"line\", \"prompt\", \"prompt_tokens\", \"sequences\": [{\"text\", \"tokens\",
   \"finish_reason\", \"logprob\"}], \"stats\", \"seed\", \"warnings\"}
(index counts prompts from 0; line is the input line number); otherwise text: a
`=== line N: \"prompt\" ===` header per prompt (the prompt quoted, cut at 60 characters),
then each sequence after a `--- sequence I/K (finish reason) ---` line.";

/// Flags of `emberlm batch`.
#[derive(Debug, Args)]
#[command(after_help = INPUT_HELP)]
pub struct BatchArgs {
    /// A GGUF file or a Hugging Face folder (default: the model in models/).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// KV cache length (default: the model's context, at most 4096).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// The prompts: one per line, plain text or a JSON object (blank lines are skipped).
    #[arg(long)]
    pub prompts: PathBuf,
    /// Write the results to this file instead of stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Treat each prompt as one user message and apply the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// A system message before each prompt (with --chat).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Recognise special tokens such as `<|im_start|>` in the prompts.
    #[arg(long)]
    pub special: bool,
    /// Reject a prompt longer than the context instead of cutting it from the left.
    #[arg(long)]
    pub strict: bool,
    /// Write one JSON object per prompt and line (JSON Lines) instead of text.
    #[arg(long, visible_alias = "json")]
    pub jsonl: bool,
    /// Sequences decoded together in one forward step (default: as many as the device, the
    /// KV memory and the step size allow; 1 runs the prompts one after another).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_batch: Option<u32>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub format: crate::format_args::FormatArgs,
}

/// Prompts handed to the engine at once: results are written after each window.
const WINDOW: usize = 256;

/// One prompt of the input file.
struct Item {
    /// 1-based line number in the file.
    line: usize,
    text: String,
    /// The flags' options with the line's own over them.
    options: GenerateOptions,
}

/// Parses one non-blank line; `base` holds the flags' options.
fn parse_line(line: usize, raw: &str, base: &GenerateOptions) -> CliResult<Item> {
    let bad = |message: String| Failure::usage(format!("line {line}: {message}"));
    if !raw.trim_start().starts_with('{') {
        return Ok(Item {
            line,
            text: raw.to_string(),
            options: base.clone(),
        });
    }
    let value: serde_json::Value =
        serde_json::from_str(raw).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let serde_json::Value::Object(mut own) = value else {
        return Err(bad("expected a JSON object".into()));
    };
    let text = match own.remove("prompt") {
        Some(serde_json::Value::String(s)) => s,
        Some(_) => return Err(bad("`prompt` must be a string".into())),
        None => return Err(bad("the object has no `prompt`".into())),
    };
    let mut options = base.clone();
    GivenOptions::from_map(&own)
        .and_then(|given| given.apply(&mut options))
        .and_then(|()| options.validate())
        .map_err(|e| bad(e.to_string()))?;
    Ok(Item {
        line,
        text,
        options,
    })
}

/// Reads and checks every line of the prompts file.
fn read_items(path: &std::path::Path, base: &GenerateOptions) -> CliResult<Vec<Item>> {
    let text = read_text(path)?;
    let mut items = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        items.push(parse_line(i + 1, raw, base)?);
    }
    if items.is_empty() {
        return Err(Failure::usage(format!(
            "`{}` has no prompts (blank lines are skipped)",
            path.display()
        )));
    }
    Ok(items)
}

/// The text form of one prompt's result.
fn write_text(out: &mut dyn Write, item: &Item, g: &Generation) -> std::io::Result<()> {
    let mut shown: String = item.text.chars().take(60).collect();
    if shown.len() < item.text.len() {
        shown.push('…');
    }
    writeln!(out, "=== line {}: {shown:?} ===", item.line)?;
    let k = g.sequences.len();
    for (i, s) in g.sequences.iter().enumerate() {
        writeln!(
            out,
            "--- sequence {}/{k} ({}) ---",
            i + 1,
            s.finish_reason.as_str()
        )?;
        writeln!(out, "{}", s.text)?;
    }
    Ok(())
}

/// The JSON Lines form of one prompt's result.
fn json_line(index: usize, item: &Item, g: &Generation) -> serde_json::Value {
    let mut obj = serde_json::Map::new();
    obj.insert("index".into(), index.into());
    obj.insert("line".into(), item.line.into());
    obj.insert("prompt".into(), item.text.clone().into());
    if let serde_json::Value::Object(rest) = generation_json(g) {
        obj.extend(rest);
    }
    serde_json::Value::Object(obj)
}

fn progress_bar(len: usize) -> ProgressBar {
    // Drawn only when stderr is a terminal.
    let bar = ProgressBar::with_draw_target(Some(len as u64), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{bar:30} {pos}/{len} prompts, {msg} [{elapsed} < {eta}]")
    {
        bar.set_style(style);
    }
    bar
}

/// `emberlm batch`.
pub fn batch(args: BatchArgs) -> CliResult<()> {
    let base = args.sampling.options(
        args.sampling.apply(&SamplingParams::default())?,
        args.special,
        args.strict,
        args.format.format()?,
    )?;
    let items = read_items(&args.prompts, &base)?;
    let mut out: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .map_err(|e| Failure::usage(format!("cannot create `{}`: {e}", path.display())))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    let engine = load_engine(args.model, args.ctx)?;
    args.sampling.spec.load_draft(&engine)?;
    let vocab = pollster::block_on(
        engine.with_session(|s| Ok(s.config().vocab_size.min(s.tokenizer().vocab_size()))),
    )?;
    let prompts = items
        .iter()
        .map(|item| {
            let prompt = if args.chat {
                let mut messages = Vec::new();
                if let Some(system) = &args.system {
                    messages.push(ChatMessage::new("system", system.clone()));
                }
                messages.push(ChatMessage::new("user", item.text.clone()));
                Prompt::Chat(messages)
            } else {
                Prompt::Text(item.text.clone())
            };
            // Checks that need the model, before anything is generated.
            let line = |e: emberlm::Error| {
                let f = Failure::from(e);
                Failure {
                    code: f.code,
                    message: format!("line {}: {}", item.line, f.message),
                }
            };
            item.options.check(vocab).map_err(line)?;
            let ids = pollster::block_on(
                engine.with_session(|s| s.tokenize_prompt(&prompt, args.special)),
            );
            if ids.map_err(line)?.is_empty() {
                return Err(Failure::usage(format!(
                    "line {}: the prompt has no tokens",
                    item.line
                )));
            }
            Ok(prompt)
        })
        .collect::<CliResult<Vec<_>>>()?;
    let bar = progress_bar(items.len());
    let start = std::time::Instant::now();
    let mut streamed = 0usize;
    let mut tokens = 0usize;
    let write_failed = |e: std::io::Error| Failure {
        code: 1,
        message: format!("cannot write the results: {e}"),
    };
    let items_with_options: Vec<BatchItem> = items
        .iter()
        .zip(&prompts)
        .map(|(item, prompt)| BatchItem {
            prompt: prompt.clone(),
            options: item.options.clone(),
        })
        .collect();
    let max_batch = args.max_batch.map(|n| n as usize);
    // Prompts go to the engine a window at a time, so results are written while later ones
    // still wait; within a window finished sequences make room for waiting ones.
    for (w, window) in items_with_options.chunks(WINDOW).enumerate() {
        let first = w * WINDOW;
        let mut on_token = |e: &emberlm::session::TokenEvent| {
            if e.id.is_some() {
                streamed += 1;
                bar.set_message(format!("{streamed} tokens"));
            }
        };
        let results = pollster::block_on(engine.generate_items(window, max_batch, &mut on_token))
            .map_err(|e| {
            let f = Failure::from(e);
            let last = (first + window.len()).min(items.len()) - 1;
            Failure {
                code: f.code,
                message: format!(
                    "lines {}..={}: {}",
                    items[first].line, items[last].line, f.message
                ),
            }
        })?;
        for (k, g) in results.iter().enumerate() {
            let (index, item) = (first + k, &items[first + k]);
            tokens += g.stats.generated_tokens;
            for w in &g.warnings {
                bar.suspend(|| eprintln!("emberlm: warning: line {}: {w}", item.line));
            }
            if args.jsonl {
                writeln!(out, "{}", json_line(index, item, g)).map_err(write_failed)?;
            } else {
                write_text(&mut out, item, g).map_err(write_failed)?;
            }
            bar.inc(1);
        }
        out.flush().map_err(write_failed)?;
    }
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "emberlm: {} prompts, {tokens} tokens in {secs:.1} s ({:.1} tok/s)",
        items.len(),
        if secs > 0.0 {
            tokens as f64 / secs
        } else {
            0.0
        }
    );
    Ok(())
}
