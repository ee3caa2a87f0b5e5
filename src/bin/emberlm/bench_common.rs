//! What the GPU and CPU benches share: the statistics of a set of runs, the prompt and greedy
//! settings every run and peer uses, and the llama.cpp peer (`tools/bench_llama_cpp.py`).

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Args;
use emberlm::sampling::SamplingParams;
use emberlm::session::{GenerateOptions, Session};
use serde::Serialize;
use serde_json::{json, Value};

use crate::{CliResult, Failure};

/// Flags of `emberlm bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A GGUF file (default: the model in models/).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prompt lengths whose prefill speed is measured.
    #[arg(long, value_delimiter = ',', default_value = "128,512")]
    pub prefill: Vec<usize>,
    /// Tokens generated (greedy) for the decode speed, after a prompt of the first length.
    #[arg(long, default_value_t = 128)]
    pub decode: usize,
    /// Runs of each measurement (median, min, max).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Generated tokens at which KV cache on and off are compared. Without the flag: 128, 256
    /// and 512, scaled down (and said so) when the estimate passes `--kv-budget-s`.
    #[arg(long, value_delimiter = ',')]
    pub kv_tokens: Option<Vec<usize>>,
    /// Seconds the KV on/off comparison may take by the estimate before it is scaled down.
    #[arg(long, default_value_t = 300.0)]
    pub kv_budget_s: f64,
    /// Small figures everywhere (prefill 16 and 32, 8 decode tokens, KV at 4 and 8): a smoke run.
    #[arg(long)]
    pub quick: bool,
    /// Run only the batched decoding section (aggregate tok/s for B = 1, 4, 8, 16).
    #[arg(long)]
    pub batch_only: bool,
    /// Run only the KV-cache kinds section (bytes per token, positions in a budget, decode
    /// tok/s per kind at `--kv-positions`).
    #[arg(long)]
    pub kv_kinds_only: bool,
    /// Run only the KV cache's worth at length: the next token's time with the cache (one
    /// decode step) and without it (the prefix computed again) at `--kv-lengths`, on the
    /// backend `--device` picks.
    #[arg(long)]
    pub kv_compare: bool,
    /// Lengths at which `--kv-compare` times the next token.
    #[arg(long, value_delimiter = ',', default_value = "100,512,1024,2048,4096")]
    pub kv_lengths: Vec<usize>,
    /// MiB copied by the bandwidth kernel.
    #[arg(long, default_value_t = 64)]
    pub copy_mib: u64,
    /// Python of a venv with llama-cpp-python (as `./build.sh bench` makes); llama.cpp is
    /// skipped, and says so, when it cannot run.
    #[arg(long)]
    pub llama_cpp_python: Option<PathBuf>,
    /// Cache positions at which each KV-cache kind's decode speed is measured.
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    pub kv_positions: Vec<usize>,
    /// Decode steps timed per KV-cache kind and position.
    #[arg(long, default_value_t = 8)]
    pub kv_steps: usize,
    /// The fixed budget (MiB) for the positions each KV-cache kind fits.
    #[arg(long, default_value_t = 64.0)]
    pub kv_budget_mb: f64,
    /// Tokens of the conversation whose next turn's first token is timed recomputed and
    /// restored from a saved state (0: not measured).
    #[arg(long, default_value_t = 1000)]
    pub saved_tokens: usize,
    /// Texts embedded per run in the CPU bench's embeddings section, beside llama.cpp's
    /// embedding mode (0: not measured).
    #[arg(long, default_value_t = 64)]
    pub embed_texts: usize,
    /// Where the JSON goes (default: bench/results/<date>-<adapter>.json, or -2, -3, … when
    /// that file exists: a result is never written over).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Median, min and max of a set of runs.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct Spread {
    pub(crate) median: f64,
    min: f64,
    max: f64,
    runs: usize,
}

impl Spread {
    pub(crate) fn of(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Self::default();
        }
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 {
            v[mid]
        } else {
            (v[mid - 1] + v[mid]) / 2.0
        };
        Self {
            median,
            min: v[0],
            max: v[v.len() - 1],
            runs: v.len(),
        }
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>10.3}  (min {:.3}, max {:.3}, n={})",
            self.median, self.min, self.max, self.runs
        )
    }
}

/// A message as a bench failure.
pub(crate) fn fail(e: impl std::fmt::Display) -> Failure {
    Failure::from(e.to_string())
}

/// The prompt: a fixed English text tokenized and repeated to `n` tokens, so every run and every
/// peer sees the same ids.
pub(crate) fn prompt_tokens(session: &Session, n: usize) -> CliResult<Vec<u32>> {
    const TEXT: &str = "The history of computing is a story of machines that became smaller, \
        faster and cheaper, and of the people who learned to program them. ";
    let ids = session.tokenizer().encode(TEXT, false, Some(false))?;
    if ids.is_empty() {
        return Err(fail(
            "the tokenizer produced no tokens for the bench prompt",
        ));
    }
    Ok(ids.iter().copied().cycle().take(n).collect())
}

/// Greedy decoding of exactly `max_new_tokens` (the end-of-sequence tokens banned), so every
/// run generates the same count.
pub(crate) fn greedy_forever(session: &Session, max_new_tokens: usize) -> GenerateOptions {
    let mut sampling = SamplingParams {
        max_new_tokens,
        ..SamplingParams::greedy()
    };
    for &id in session.eos_ids() {
        sampling.logit_bias.insert(id, -100.0);
    }
    GenerateOptions {
        sampling,
        ..GenerateOptions::default()
    }
}

/// The llama.cpp peer: runs `tools/bench_llama_cpp.py` once; `Err` carries why it could not.
pub(crate) fn llama_cpp_once(
    python: &Path,
    model: &Path,
    prompts: &[Vec<u32>],
    decode_prompt: &[u32],
    decode: usize,
    threads: Option<usize>,
) -> Result<Value, String> {
    let request = json!({
        "model": model,
        "prompts": prompts,
        "decode_prompt": decode_prompt,
        "decode": decode,
        "threads": threads,
    });
    python_request(python, "tools/bench_llama_cpp.py", &request)
}

/// Runs the bench's Python `script` (a path in the source tree) on `request` (written to a
/// file it reads) and parses the JSON it prints; the error is its last line of stderr.
pub(crate) fn python_request(
    python: &Path,
    script: &str,
    request: &Value,
) -> Result<Value, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let dir = std::env::temp_dir().join(format!("emberlm-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let req_path = dir.join("request.json");
    std::fs::write(&req_path, request.to_string()).map_err(|e| e.to_string())?;
    let out = Command::new(python)
        .arg(&script)
        .arg(&req_path)
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("no message");
        return Err(format!("llama.cpp run failed: {last}"));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("llama.cpp output: {e}"))
}

/// `name` as lowercase words joined by `-` (for result file names).
pub(crate) fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    s.split('-')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

/// `bench/results/<stem>.json`, or `<stem>-2.json`, `-3`, … where that is taken: a default
/// result name carries only the date, and a second run the same day (another machine's, a
/// profiling run) must not write over a result kept in the repository.
pub(crate) fn fresh_result_path(stem: &str) -> PathBuf {
    let dir = PathBuf::from("bench/results");
    let first = dir.join(format!("{stem}.json"));
    if !first.exists() {
        return first;
    }
    (2..)
        .map(|n| dir.join(format!("{stem}-{n}.json")))
        .find(|p| !p.exists())
        .unwrap_or(first)
}
