//! The `emberlm` command-line tool (native only; on wasm32 this compiles to an empty program).

#[cfg(not(target_arch = "wasm32"))]
mod batch;
#[cfg(not(target_arch = "wasm32"))]
mod bench;
#[cfg(not(target_arch = "wasm32"))]
mod bench_batch;
#[cfg(not(target_arch = "wasm32"))]
mod bench_common;
#[cfg(not(target_arch = "wasm32"))]
mod bench_cpu;
#[cfg(not(target_arch = "wasm32"))]
mod bench_embed;
#[cfg(not(target_arch = "wasm32"))]
mod bench_kv;
#[cfg(not(target_arch = "wasm32"))]
mod bench_kv_length;
#[cfg(not(target_arch = "wasm32"))]
mod bench_precision;
#[cfg(not(target_arch = "wasm32"))]
mod bench_saved;
#[cfg(not(target_arch = "wasm32"))]
mod bench_spec;
#[cfg(not(target_arch = "wasm32"))]
mod chat;
#[cfg(not(target_arch = "wasm32"))]
mod chat_saved;
#[cfg(not(target_arch = "wasm32"))]
mod chat_settings;
#[cfg(not(target_arch = "wasm32"))]
mod decode_args;
#[cfg(not(target_arch = "wasm32"))]
mod embed;
#[cfg(not(target_arch = "wasm32"))]
mod format_args;
#[cfg(not(target_arch = "wasm32"))]
mod generate;
#[cfg(not(target_arch = "wasm32"))]
mod info;
#[cfg(not(target_arch = "wasm32"))]
mod kv_args;
#[cfg(not(target_arch = "wasm32"))]
mod logits;
#[cfg(not(target_arch = "wasm32"))]
mod profile;
#[cfg(not(target_arch = "wasm32"))]
mod sampling_args;
#[cfg(not(target_arch = "wasm32"))]
mod serve_api;
#[cfg(not(target_arch = "wasm32"))]
mod serve_batch;
#[cfg(not(target_arch = "wasm32"))]
mod serve_embed;
#[cfg(not(target_arch = "wasm32"))]
mod serve_http;
#[cfg(not(target_arch = "wasm32"))]
mod serve_shared;
#[cfg(not(target_arch = "wasm32"))]
mod spec_args;

#[cfg(not(target_arch = "wasm32"))]
pub use cli::{load_engine, CliResult, Failure};

#[cfg(not(target_arch = "wasm32"))]
mod cli {
    use std::path::{Path, PathBuf};

    use clap::{Parser, Subcommand};
    use emberlm::dtype::kv::KvKinds;
    use emberlm::engine::{Engine, EngineOptions, LoadOptions, OptionValue, Surface};
    use emberlm::loader::ModelFiles;
    use emberlm::session::CachePlanOptions;
    use emberlm::{GpuContext, GpuOptions};

    use crate::batch::BatchArgs;
    use crate::chat::ChatArgs;
    use crate::generate::{GenerateArgs, PerplexityArgs};

    /// Why the program stops: a usage error (exit code 2) or a runtime error (exit code 1).
    #[derive(Debug)]
    pub struct Failure {
        /// 1 or 2.
        pub code: u8,
        /// The one-line message.
        pub message: String,
    }

    impl Failure {
        /// A usage error (bad flag value, unreadable input file): exit code 2.
        pub fn usage(message: impl Into<String>) -> Self {
            Self {
                code: 2,
                message: message.into(),
            }
        }
    }

    impl From<emberlm::Error> for Failure {
        fn from(e: emberlm::Error) -> Self {
            let code = match e {
                emberlm::Error::InvalidArgument { .. } => 2,
                _ => 1,
            };
            Self {
                code,
                message: e.to_string(),
            }
        }
    }

    impl From<String> for Failure {
        fn from(message: String) -> Self {
            Self { code: 1, message }
        }
    }

    impl From<serde_json::Error> for Failure {
        fn from(e: serde_json::Error) -> Self {
            Self {
                code: 1,
                message: e.to_string(),
            }
        }
    }

    impl From<Box<dyn std::error::Error>> for Failure {
        fn from(e: Box<dyn std::error::Error>) -> Self {
            Self {
                code: 1,
                message: e.to_string(),
            }
        }
    }

    /// What subcommands return.
    pub type CliResult<T> = Result<T, Failure>;

    /// Opens the model (`--model` or the default) and loads it on the backend `--device`
    /// asks for.
    pub fn load_engine(model: Option<PathBuf>, context: Option<usize>) -> CliResult<Engine> {
        load_engine_with(model, context, |_| {})
    }

    /// [`load_engine`] with the load options changed by `change` (a second run in another
    /// precision).
    pub fn load_engine_with(
        model: Option<PathBuf>,
        context: Option<usize>,
        change: impl FnOnce(&mut EngineOptions),
    ) -> CliResult<Engine> {
        let path = model_path(model)?;
        let files = ModelFiles::open(&path)?;
        if context == Some(0) {
            return Err(Failure::usage("--ctx must be at least 1"));
        }
        let base = load_options();
        let mut options = EngineOptions {
            context: context.or(base.context),
            ..base
        };
        change(&mut options);
        let engine = pollster::block_on(Engine::load(files, options))?;
        let notice = engine
            .inspect(|s| s.gpu().and_then(|g| g.precision_notice().map(String::from)))
            .flatten();
        for notice in notice
            .iter()
            .map(String::as_str)
            .chain(engine.backend_notice())
        {
            eprintln!("emberlm: {notice}");
        }
        Ok(engine)
    }

    /// The default model, fetched by `./build.sh setup`.
    const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

    /// Reads a text file named on the command line (unreadable: a usage error).
    pub fn read_text(path: &Path) -> CliResult<String> {
        std::fs::read_to_string(path)
            .map_err(|e| Failure::usage(format!("cannot read `{}`: {e}", path.display())))
    }

    /// `--model`, or the default model in `./models/` (or in the source tree of a dev build).
    pub fn model_path(given: Option<PathBuf>) -> Result<PathBuf, String> {
        if let Some(p) = given {
            return Ok(p);
        }
        let candidates = [
            PathBuf::from(DEFAULT_MODEL),
            Path::new(env!("CARGO_MANIFEST_DIR")).join(DEFAULT_MODEL),
        ];
        candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
            format!(
                "no --model given and the default model `{DEFAULT_MODEL}` is missing; \
                 run `./build.sh setup` to fetch it, or pass --model PATH (a GGUF file or a \
                 Hugging Face folder)"
            )
        })
    }

    /// Run large language models on the GPU through wgpu.
    ///
    /// Every subcommand takes `--model PATH` (a GGUF file or a Hugging Face folder; default: the
    /// model in models/) and, where it runs the model, `--ctx N` (KV cache length). Exit status:
    /// 0 success, 2 usage error (bad flag or value, unreadable input file), 1 runtime error.
    /// Messages go to stderr.
    #[derive(Debug, Parser)]
    #[command(name = "emberlm", version, about, long_about)]
    struct Cli {
        /// Force kernel variants instead of the measured plan: `rows` or `workgroup` for every
        /// kernel family, or `linear_decode=rows,attention=workgroup` (families:
        /// linear_decode, linear_prefill, attention). Also read from `EMBERLM_KERNELS`.
        #[arg(long, global = true, value_name = "SPEC")]
        kernels: Option<String>,
        #[command(flatten)]
        kv: crate::kv_args::KvArgs,
        #[command(flatten)]
        decode: crate::decode_args::DecodeArgs,
        /// Precision of the matrix products: f32 (default), f16 (inputs and products in f16,
        /// sums in f32; needs the adapter feature shader-f16) or auto (f16 on a GPU that has
        /// it; f32 on software adapters, which emulate f16). `logits` with f16 also runs f32
        /// and reports how the two agree.
        #[arg(long, global = true, value_name = "f32|f16|auto")]
        precision: Option<String>,
        /// Which backend runs the model: auto (default: a hardware GPU; on a software adapter
        /// such as lavapipe, it or the CPU backend, whichever decodes faster, measured once and
        /// kept in the tune store; the CPU where there is no adapter), gpu (the adapter, even a
        /// software one) or cpu (the CPU backend, no GPU used). Also `EMBERLM_DEVICE`.
        #[arg(
            long,
            global = true,
            value_name = "auto|gpu|cpu",
            alias = "backend",
            env = "EMBERLM_DEVICE"
        )]
        device: Option<String>,
        /// A Jinja chat template file to use instead of the model's own (for files without
        /// one, such as Gemma 3's GGUF); its end-of-turn token stops a reply.
        #[arg(long, global = true, value_name = "FILE")]
        chat_template: Option<PathBuf>,
        /// A settings file (JSON) of load options, as `Engine.load` takes them (`kvCache`,
        /// `cache_kind`, `contextLength`/`max_seq_len`, `decodePlan`, `cacheBudgetMb`, ...);
        /// flags given on the command line win over it. An unknown key is an error naming the
        /// nearest known one.
        #[arg(long, global = true, value_name = "FILE")]
        config: Option<PathBuf>,
        #[command(subcommand)]
        command: Command,
    }

    /// The load options of every subcommand (the global flags over `--config`), read and
    /// validated once by `main`.
    static LOAD: std::sync::OnceLock<EngineOptions> = std::sync::OnceLock::new();

    fn load_options() -> EngineOptions {
        LOAD.get().cloned().unwrap_or_default()
    }

    /// What the CPU backend multiplies quantized matrices with (`--precision f32`: exact).
    pub fn cpu_precision() -> emberlm::backend::cpu::CpuPrecision {
        load_options().cpu_precision
    }

    /// `--ctx` where given, else the `--config` file's `contextLength`.
    pub fn context(given: Option<usize>) -> Option<usize> {
        given.or(load_options().context)
    }

    /// The KV-cache kinds every subcommand uses (`--kv-cache` and friends; f32 by default).
    pub fn kv_kinds() -> KvKinds {
        load_options().gpu.kv_cache
    }

    /// The automatic cache plan's settings, with `--kv-cache auto`.
    pub fn cache_plan() -> Option<CachePlanOptions> {
        load_options().cache_plan
    }

    /// The GPU options every subcommand uses: the defaults with `--kernels`, the KV-cache
    /// kinds, the decode plan, the precision and the device applied.
    pub fn gpu_options() -> GpuOptions {
        load_options().gpu
    }

    /// The global flags given, over the `--config` file's options: one [`LoadOptions`],
    /// validated once.
    fn read_load_options(cli: &Cli) -> emberlm::Result<EngineOptions> {
        let mut o = LoadOptions::new(Surface::Cli);
        let text = |s: &Option<String>| s.clone().map(OptionValue::Text);
        for (flag, value) in [
            ("--kernels", text(&cli.kernels)),
            ("--precision", text(&cli.precision)),
            ("--device", text(&cli.device)),
        ] {
            if let Some(value) = value {
                o.set(flag, value)?;
            }
        }
        if let Some(path) = &cli.chat_template {
            let source = std::fs::read_to_string(path).map_err(|e| {
                emberlm::Error::invalid(
                    "chatTemplate",
                    format!("--chat-template {}: {e}", path.display()),
                )
            })?;
            o.set("--chat-template", OptionValue::Text(source))?;
        }
        cli.kv.fill(&mut o)?;
        cli.decode.fill(&mut o)?;
        if let Some(path) = &cli.config {
            let shown = path.display().to_string();
            let text = std::fs::read_to_string(path)
                .map_err(|e| emberlm::Error::invalid("config", format!("--config {shown}: {e}")))?;
            o = o.over(LoadOptions::from_file_text(&text, &shown)?);
        }
        o.resolve()
    }

    #[derive(Debug, Subcommand)]
    enum Command {
        /// Generate text from a prompt (sampling, beam search, several sequences).
        Generate(Box<GenerateArgs>),
        /// Talk with the model: one line per message on stdin, replies streamed to stdout.
        Chat(Box<ChatArgs>),
        /// Serve the OpenAI-style HTTP API (chat completions, completions, models) on loopback.
        ServeApi(Box<crate::serve_api::ServeApiArgs>),
        /// Generate for every prompt of a file (plain lines or JSON lines), in input order.
        Batch(Box<BatchArgs>),
        /// Mean negative log-likelihood and perplexity of a text file (JSON).
        Perplexity(PerplexityArgs),
        /// Embed texts: one JSON line per text with its pooled final hidden state.
        Embed(crate::embed::EmbedArgs),
        /// Benchmarks: speed, memory, engine counters, bandwidth, llama.cpp side by side.
        Bench(Box<crate::bench::BenchArgs>),
        /// Time per kernel of one decode step and one prefill chunk, with the kernel plan.
        Profile(crate::profile::ProfileArgs),
        /// Describe the GPU adapter and device emberlm would use.
        Adapter {
            /// Print JSON instead of text.
            #[arg(long)]
            json: bool,
            /// Do not request the `subgroups` feature.
            #[arg(long)]
            no_subgroups: bool,
        },
        /// Turn text into token ids: JSON `{"tokens": [...], "pieces": [...]}`.
        Tokenize {
            /// A GGUF file or a Hugging Face folder (default: the model in models/).
            #[arg(long)]
            model: Option<PathBuf>,
            /// The text to tokenize.
            #[arg(long)]
            prompt: String,
            /// Recognise special tokens such as `<|im_start|>` in the text.
            #[arg(long)]
            special: bool,
            /// Add the BOS token (`true`/`false`; default: what the model asks for).
            #[arg(long)]
            bos: Option<bool>,
            /// JSON output: the default and only format (accepted for symmetry with `info`).
            #[arg(long)]
            json: bool,
        },
        /// Run the model on the GPU and print the top logits at every input position (JSON).
        Logits {
            /// A GGUF file or a Hugging Face folder (default: the model in models/).
            #[arg(long)]
            model: Option<PathBuf>,
            /// The input text (tokenized with the model's tokenizer).
            #[arg(long, conflicts_with = "tokens", required_unless_present = "tokens")]
            prompt: Option<String>,
            /// Recognise special tokens such as `<|im_start|>` in the prompt.
            #[arg(long)]
            special: bool,
            /// The input as token ids, comma-separated.
            #[arg(long, value_delimiter = ',')]
            tokens: Option<Vec<u32>>,
            /// How many (id, logit) pairs per position.
            #[arg(long, default_value_t = 5)]
            top: usize,
            /// Feed the first token as a prefill, then every later token one at a time
            /// through the KV cache (the decode path), instead of one prefill.
            #[arg(long)]
            decode: bool,
            /// KV cache length (default: the model's context, at most 4096).
            #[arg(long)]
            ctx: Option<usize>,
            /// JSON output: the default and only format (accepted for symmetry with `info`).
            #[arg(long)]
            json: bool,
        },
        /// Describe a model: configuration, tensors per type, weight bytes, GPU memory.
        Info {
            /// A GGUF file or a Hugging Face folder (default: the model in models/).
            #[arg(long)]
            model: Option<PathBuf>,
            /// Context length for the memory estimate (default: the model's, at most 4096).
            #[arg(long = "ctx", visible_alias = "context")]
            ctx: Option<usize>,
            /// Sequences decoded together (`batch`, samples, beams): the estimate holds a KV
            /// slot of the context for each.
            #[arg(long, default_value_t = 1)]
            batch: usize,
            /// Print JSON instead of text.
            #[arg(long)]
            json: bool,
        },
    }

    pub fn main() -> std::process::ExitCode {
        let cli = Cli::parse();
        match read_load_options(&cli) {
            Ok(options) => {
                let _ = LOAD.set(options);
            }
            Err(e) => {
                eprintln!("emberlm: {e}");
                return std::process::ExitCode::from(2);
            }
        }
        let result = match cli.command {
            Command::Generate(args) => crate::generate::generate(*args),
            Command::Perplexity(args) => crate::generate::perplexity(args),
            Command::Embed(args) => crate::embed::embed(args),
            Command::Chat(args) => crate::chat::chat(*args),
            Command::ServeApi(args) => crate::serve_api::serve_api(*args),
            Command::Batch(args) => crate::batch::batch(*args),
            Command::Bench(args) => crate::bench::bench(*args),
            Command::Profile(args) => crate::profile::profile(args),
            other => run(other),
        };
        match result {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("emberlm: {}", e.message);
                std::process::ExitCode::from(e.code)
            }
        }
    }

    fn tokenize(
        model: Option<PathBuf>,
        text: &str,
        special: bool,
        bos: Option<bool>,
    ) -> CliResult<()> {
        let files = ModelFiles::open(&model_path(model)?)?;
        let tokenizer = files.tokenizer()?;
        let ids = tokenizer.encode(text, special, bos)?;
        let pieces = ids
            .iter()
            .map(|&id| tokenizer.decode(&[id], false))
            .collect::<Result<Vec<_>, _>>()?;
        let out = serde_json::json!({ "tokens": ids, "pieces": pieces });
        println!("{}", serde_json::to_string(&out)?);
        Ok(())
    }

    fn run(command: Command) -> CliResult<()> {
        match command {
            Command::Generate(_)
            | Command::Perplexity(_)
            | Command::Embed(_)
            | Command::Chat(_)
            | Command::ServeApi(_)
            | Command::Batch(_)
            | Command::Bench(_)
            | Command::Profile(_) => Ok(()),
            Command::Logits {
                model,
                prompt,
                special,
                tokens,
                top,
                decode,
                ctx,
                json: _,
            } => crate::logits::logits(model, prompt, special, tokens, top, decode, ctx),
            Command::Tokenize {
                model,
                prompt,
                special,
                bos,
                json: _,
            } => tokenize(model, &prompt, special, bos),
            Command::Info {
                model,
                ctx,
                batch,
                json,
            } => crate::info::info(model, ctx, batch, json),
            Command::Adapter { json, no_subgroups } => {
                let options = GpuOptions {
                    allow_subgroups: !no_subgroups,
                    ..gpu_options()
                };
                let ctx = pollster::block_on(GpuContext::new(options))?;
                let report = ctx.report();
                if json {
                    println!("{}", serde_json::to_string_pretty(report)?);
                } else {
                    println!("adapter:   {}", report.name);
                    println!("backend:   {} ({})", report.backend, report.device_type);
                    println!("driver:    {} {}", report.driver, report.driver_info);
                    println!(
                        "subgroups: {} (sizes {}..={})",
                        report.subgroups, report.subgroup_min_size, report.subgroup_max_size
                    );
                    println!("shader-f16: {}", report.shader_f16);
                    println!(
                        "max storage binding: {} bytes, max buffer: {} bytes",
                        report.limits.max_storage_buffer_binding_size,
                        report.limits.max_buffer_size
                    );
                    println!("features:  {}", report.device_features.join(", "));
                }
                Ok(())
            }
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn main() -> std::process::ExitCode {
    cli::main()
}

#[cfg(target_arch = "wasm32")]
fn main() {}
