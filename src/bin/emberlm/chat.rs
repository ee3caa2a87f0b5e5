//! `emberlm chat`: a conversation read line by line from stdin, replies streamed to stdout.
//!
//! Output contract (stable, for scripts): replies go to stdout, each ended by a newline; command
//! answers go to stdout as lines starting with `# `; errors, warnings and the stats line after
//! each reply go to stderr.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;

use clap::Args;
use emberlm::chat::ChatMessage;
use emberlm::engine::{AbortSwitch, Engine};
use emberlm::sampling::SamplingParams;
use emberlm::session::{FinishReason, GenerateOptions, Generation, Prompt, TokenEvent};

use crate::chat_settings::{parameter, value_of, with_value};
use crate::sampling_args::SamplingArgs;
use crate::{load_engine, CliResult, Failure};

/// The commands, as `/help` and `emberlm chat --help` list them.
const COMMANDS: &str = "\
Commands (a line starting with `/`; any other line is a message to the model):
  /temp V         temperature (0: greedy)
  /top_k N        keep the N most likely tokens (0: off)
  /top_p V        nucleus sampling mass in (0, 1]
  /min_p V        keep tokens at least V times as likely as the best, in [0, 1]
  /typical_p V    locally typical sampling mass in (0, 1]
  /rep_pen V      repetition penalty (1: off)
  /max_tokens N   most tokens per reply
  /seed N         the same seed for every reply (`/seed random`: a fresh one each time)
  /system TEXT    set the system message (`/system` alone removes it)
  /reset          forget the conversation (settings stay)
  /save FILE      write the conversation (messages and KV cache) to FILE
  /load FILE      continue a conversation /save wrote, without reading it again
  /spec [...]     speculative decoding: show, `off`, `lookup`, `draft`, `k N`, `adaptive on|off`,
                  `extra on|off`, `disable-below RATE`
  /settings       show the current values
  /help           this list
  /quit           leave (also `quit`, `exit`, Ctrl-D)
A setting command without a value shows the value. A bad value is rejected and the old one stays.
A line ending with `\\` continues on the next line; `//text` sends `/text` as a message.
Ctrl-C stops the reply being written; at the prompt it leaves (exit status 130).
Exit status 0 at the end of input, or 1 when a reply failed (the message is dropped).
Command answers are printed as lines starting with `# `; errors and per-reply stats go to stderr.";

/// Flags of `emberlm chat`.
#[derive(Debug, Args)]
#[command(after_help = COMMANDS)]
pub struct ChatArgs {
    /// A GGUF file or a Hugging Face folder (default: the model in models/).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// KV cache length (default: the model's context, at most 4096). A longer conversation
    /// is cut from the left.
    #[arg(long)]
    pub ctx: Option<usize>,
    /// A system message sent before the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// Plain completion for base models: no chat template; each line is appended to the
    /// running text (after a newline) and the model continues it.
    #[arg(long = "no-template", alias = "no_template")]
    pub no_template: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub format: crate::format_args::FormatArgs,
}

/// What a command asks the loop to do next.
enum Flow {
    Continue,
    Quit,
}

/// The conversation and the settings that commands change.
struct Conversation {
    params: SamplingParams,
    /// `--no-kv-cache`: every reply recomputes the whole conversation at every token.
    no_kv_cache: bool,
    /// `--no-template`: the conversation is one running text.
    plain: bool,
    /// Speculative decoding (`/spec`), `None`: off.
    speculative: Option<emberlm::session::SpecOptions>,
    /// `--json-object`, `--json-schema` ...: the shape of every reply.
    format: emberlm::constrain::ResponseFormat,
    system: Option<String>,
    history: Vec<ChatMessage>,
}

impl Conversation {
    /// The system message (if any) followed by the history.
    fn messages(&self) -> Vec<ChatMessage> {
        let mut out = Vec::with_capacity(self.history.len() + 1);
        if let Some(system) = &self.system {
            out.push(ChatMessage::new("system", system.clone()));
        }
        out.extend(self.history.iter().cloned());
        out
    }

    /// The prompt of the next reply: the messages through the chat template, or with
    /// `--no-template` one running text (the system message, then each line after a newline,
    /// each continuation as the model wrote it).
    fn prompt(&self) -> Prompt {
        if !self.plain {
            return Prompt::Chat(self.messages());
        }
        let mut text = String::new();
        for m in self.messages() {
            if m.role != "assistant" && !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&m.content);
        }
        Prompt::Text(text)
    }
}

/// What the stdin reader hands to the main loop.
enum Input {
    Message(String),
    Eof,
    /// Ctrl-C while no reply was running.
    Interrupt,
    Failed(Failure),
}

/// Ctrl-C: stops the running reply, or ends the program (through the main loop, so the model
/// is released normally) when no reply is running.
struct Interrupt {
    generating: Arc<AtomicBool>,
}

impl Interrupt {
    fn install(abort: AbortSwitch, inputs: Sender<Input>) -> Self {
        let generating = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&generating);
        let installed = ctrlc::set_handler(move || {
            if flag.load(Ordering::SeqCst) {
                abort.abort();
            } else {
                let _ = inputs.send(Input::Interrupt);
            }
        });
        if let Err(e) = installed {
            eprintln!("emberlm: warning: Ctrl-C will not stop a reply: {e}");
        }
        Self { generating }
    }

    fn set_generating(&self, on: bool) {
        self.generating.store(on, Ordering::SeqCst);
    }
}

/// Reads stdin on a thread of its own, one message each time the returned sender asks, so
/// that the main loop can wait for a message or a Ctrl-C alike.
fn spawn_reader(inputs: Sender<Input>, tty: bool) -> Sender<()> {
    let (ask, asked) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut input = stdin.lock();
        while asked.recv().is_ok() {
            let next = match read_message(&mut input, tty) {
                Ok(Some(m)) => Input::Message(m),
                Ok(None) => Input::Eof,
                Err(f) => Input::Failed(f),
            };
            let last = !matches!(next, Input::Message(_));
            if inputs.send(next).is_err() || last {
                break;
            }
        }
    });
    ask
}

/// Ends the current stdout line (a closed stdout is not an error here).
fn newline() {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out);
    let _ = out.flush();
}

/// A parameter count as people say it: 135M, 1.2B, 48K.
fn count(n: u64) -> String {
    let n = n as f64;
    match n {
        n if n >= 1e9 => format!("{:.1}B", n / 1e9),
        n if n >= 1e6 => format!("{:.0}M", n / 1e6),
        n if n >= 1e3 => format!("{:.0}K", n / 1e3),
        n => format!("{n}"),
    }
}

/// Prints command output: every line prefixed with `# `.
fn answer(text: &str) {
    let mut out = std::io::stdout().lock();
    for line in text.lines() {
        let _ = writeln!(out, "# {line}");
    }
    let _ = out.flush();
}

/// Runs one command (the line without its leading `/`).
fn command(line: &str, conv: &mut Conversation, engine: &Engine) -> Flow {
    let (name, rest) = match line.split_once(char::is_whitespace) {
        Some((name, rest)) => (name, rest.trim()),
        None => (line, ""),
    };
    match name {
        "quit" | "exit" | "q" => return Flow::Quit,
        "help" | "?" => answer(COMMANDS),
        "reset" => {
            conv.history.clear();
            match pollster::block_on(engine.reset()) {
                Ok(()) => answer("conversation cleared"),
                Err(e) => eprintln!("emberlm: {e}"),
            }
        }
        "save" => {
            let saved = crate::chat_saved::Saved {
                system: conv.system.clone(),
                history: conv.history.clone(),
            };
            match crate::chat_saved::save(engine, &saved, rest) {
                Ok(line) => answer(&line),
                Err(e) => eprintln!("emberlm: {e}"),
            }
        }
        "load" => match crate::chat_saved::load(engine, rest) {
            Ok((saved, line)) => {
                conv.system = saved.system;
                conv.history = saved.history;
                answer(&line);
            }
            Err(e) => eprintln!("emberlm: {e} (the conversation stays as it was)"),
        },
        "system" => {
            conv.system = (!rest.is_empty()).then(|| rest.to_string());
            match &conv.system {
                Some(s) => answer(&format!("system = {s:?}")),
                None => answer("system = (none)"),
            }
        }
        "spec" => {
            let has_draft = pollster::block_on(engine.with_session(|s| Ok(s.draft().is_some())));
            match crate::spec_args::spec_command(
                rest,
                &mut conv.speculative,
                has_draft.unwrap_or(false),
            ) {
                Ok(line) => answer(&line),
                Err(e) => eprintln!(
                    "emberlm: {e} ({})",
                    crate::spec_args::describe(conv.speculative.as_ref())
                ),
            }
        }
        "settings" => {
            let p = &conv.params;
            let mut text = String::new();
            for name in [
                "temperature",
                "top_k",
                "top_p",
                "min_p",
                "typical_p",
                "repetition_penalty",
                "max_new_tokens",
                "seed",
            ] {
                text.push_str(&format!("{name} = {}\n", value_of(p, name)));
            }
            if !p.stop.is_empty() {
                text.push_str(&format!("stop = {:?}\n", p.stop));
            }
            if p.num_beams > 1 {
                text.push_str(&format!("num_beams = {}\n", p.num_beams));
            }
            match &conv.system {
                Some(s) => text.push_str(&format!("system = {s:?}\n")),
                None => text.push_str("system = (none)\n"),
            }
            match pollster::block_on(engine.with_session(|s| Ok(s.context()))) {
                Ok(context) => text.push_str(&format!("context = {context}\n")),
                Err(e) => text.push_str(&format!("context = (unknown: {e})\n")),
            }
            text.push_str(&format!("history = {} messages", conv.history.len()));
            answer(&text);
        }
        other => match parameter(other) {
            Some(param) if rest.is_empty() => {
                answer(&format!("{param} = {}", value_of(&conv.params, param)));
            }
            Some(param) => match with_value(&conv.params, param, rest) {
                Ok(p) => {
                    conv.params = p;
                    answer(&format!("{param} = {}", value_of(&conv.params, param)));
                }
                Err(e) => eprintln!(
                    "emberlm: {e} ({param} stays {})",
                    value_of(&conv.params, param)
                ),
            },
            None => eprintln!("emberlm: unknown command `/{other}`; type /help for the list"),
        },
    }
    Flow::Continue
}

/// Reads one message (lines ending with `\` continue it). `None` at end of input.
fn read_message(input: &mut impl BufRead, tty: bool) -> CliResult<Option<String>> {
    let mut message = String::new();
    loop {
        if tty {
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "{}", if message.is_empty() { "> " } else { ". " });
            let _ = out.flush();
        }
        let mut line = String::new();
        match input.read_line(&mut line) {
            Ok(0) => {
                if tty {
                    newline();
                }
                return Ok((!message.is_empty()).then_some(message));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                eprintln!("emberlm: the line is not valid UTF-8; it was skipped");
                continue;
            }
            Err(e) => {
                return Err(Failure {
                    code: 1,
                    message: format!("cannot read stdin: {e}"),
                })
            }
        }
        let line = line.trim_end_matches(['\n', '\r']);
        match line.strip_suffix('\\') {
            Some(head) => {
                message.push_str(head);
                message.push('\n');
            }
            None => {
                message.push_str(line);
                return Ok(Some(message));
            }
        }
    }
}

/// The stderr line after a reply.
fn stats_line(g: &Generation) -> String {
    let s = &g.stats;
    let reason = match g.sequences.first().map(|s| s.finish_reason) {
        Some(FinishReason::Abort) => ", stopped",
        Some(FinishReason::Length) => ", max_tokens reached",
        _ => "",
    };
    format!(
        "[{} tokens, {:.1} tok/s, TTFT {:.0} ms, prompt {} tokens ({} cached){reason}]",
        s.generated_tokens,
        s.decode_tok_per_s,
        s.time_to_first_token_ms,
        s.prompt_tokens,
        s.cached_tokens,
    ) + &s.speculative.as_ref().map_or(String::new(), |sp| {
        format!(
            " [{}: {}/{} drafts accepted ({:.0}%), {} model steps]",
            sp.method,
            sp.accepted,
            sp.drafted,
            100.0 * sp.acceptance_rate,
            sp.target_steps
        )
    })
}

/// Sends `text` as the next user message and streams the reply. False when generation failed
/// (the message is then dropped from the history).
fn reply(text: &str, conv: &mut Conversation, engine: &Engine, interrupt: &Interrupt) -> bool {
    conv.history.push(ChatMessage::new("user", text));
    let prompt = conv.prompt();
    let options = GenerateOptions {
        sampling: conv.params.clone(),
        no_kv_cache: conv.no_kv_cache,
        speculative: conv.speculative.clone(),
        response_format: conv.format.clone(),
        ..GenerateOptions::default()
    };
    let mut printed = false;
    let mut on_token = |e: &TokenEvent| {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(e.text.as_bytes());
        let _ = out.flush();
        printed |= !e.text.is_empty();
    };
    interrupt.set_generating(true);
    let result = pollster::block_on(engine.generate(&prompt, &options, &mut on_token));
    interrupt.set_generating(false);
    match result {
        Ok(g) => {
            newline();
            for w in &g.warnings {
                eprintln!("emberlm: warning: {w}");
            }
            // A reply stopped by Ctrl-C stays in the history as far as it got.
            let answer = g.sequences.first().map(|s| s.text.clone());
            conv.history
                .push(ChatMessage::new("assistant", answer.unwrap_or_default()));
            eprintln!("{}", stats_line(&g));
            true
        }
        Err(e) => {
            if printed {
                newline();
            }
            conv.history.pop();
            eprintln!("emberlm: {e}");
            false
        }
    }
}

/// `emberlm chat`.
pub fn chat(args: ChatArgs) -> CliResult<()> {
    let params = args.sampling.apply(&SamplingParams::default())?;
    if params.num_return_sequences > 1 {
        return Err(Failure::usage(
            "chat writes one reply per message: --num-return-sequences must be 1",
        ));
    }
    if args.sampling.echo {
        return Err(Failure::usage(
            "chat prints the replies only: --echo is for generate and batch",
        ));
    }
    let speculative = args.sampling.spec.options()?;
    let format = args.format.format()?;
    let engine = load_engine(args.model, args.ctx)?;
    args.sampling.spec.load_draft(&engine)?;
    let (inputs, received) = mpsc::channel();
    let interrupt = Interrupt::install(engine.abort_switch(), inputs.clone());
    let mut conv = Conversation {
        params,
        no_kv_cache: args.sampling.no_kv_cache,
        plain: args.no_template,
        speculative,
        format,
        system: args.system,
        history: Vec::new(),
    };
    let tty = std::io::stdin().is_terminal();
    let parameters = engine.files().weights()?.parameter_count();
    let plain = conv.plain;
    let p = &conv.params;
    let sampling = if p.is_greedy() {
        "greedy".to_string()
    } else {
        format!(
            "temperature {}, top-k {}, top-p {}",
            p.temperature,
            if p.top_k == 0 {
                "off".to_string()
            } else {
                p.top_k.to_string()
            },
            p.top_p
        )
    };
    let banner = pollster::block_on(engine.with_session(|session| {
        Ok(format!(
            "emberlm chat: {} ({} parameters), context {} tokens ({}){}; {sampling}, at most {} tokens per reply; /help lists the commands, /quit leaves",
            engine.files().name(),
            count(parameters),
            session.context(),
            session.context_choice().reason,
            if plain {
                ", plain completion (--no-template)"
            } else if session.has_chat_template() {
                ""
            } else {
                ", no chat template in the model (plain fallback)"
            },
            p.max_new_tokens,
        ))
    }))?;
    eprintln!("{banner}");
    let ask = spawn_reader(inputs, tty);
    let mut failed = 0usize;
    loop {
        if ask.send(()).is_err() {
            break;
        }
        let message = match received.recv() {
            Ok(Input::Message(m)) => m,
            Ok(Input::Eof) | Err(_) => break,
            Ok(Input::Interrupt) => {
                if tty {
                    newline();
                }
                return Err(Failure {
                    code: 130,
                    message: "interrupted".into(),
                });
            }
            Ok(Input::Failed(f)) => return Err(f),
        };
        let line = message.trim();
        if line.is_empty() {
            continue;
        }
        if matches!(line, "quit" | "exit") {
            break;
        }
        // a bare `help` or `?` is a request for the commands, not a message for the model
        // (`//help` sends the word)
        if matches!(line, "help" | "?") {
            answer(COMMANDS);
            continue;
        }
        let text = match line.strip_prefix('/') {
            Some(rest) if rest.starts_with('/') => rest,
            Some(rest) => match command(rest, &mut conv, &engine) {
                Flow::Quit => break,
                Flow::Continue => continue,
            },
            None => line,
        };
        if !reply(text, &mut conv, &engine, &interrupt) {
            failed += 1;
        }
    }
    if failed > 0 {
        return Err(Failure {
            code: 1,
            message: if failed == 1 {
                "1 reply failed".to_string()
            } else {
                format!("{failed} replies failed")
            },
        });
    }
    Ok(())
}
