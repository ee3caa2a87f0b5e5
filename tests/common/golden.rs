//! Golden outputs from the float64 reference (`tests/fixtures/golden/*.golden.json`) and the
//! checks every forward pass (CPU reference or GPU, native or browser) must pass.

use serde::Deserialize;

/// One `*.golden.json` file.
#[derive(Debug, Deserialize)]
pub struct Golden {
    /// Model file name.
    pub model: String,
    /// One entry per prompt.
    pub results: Vec<GoldenResult>,
}

/// The reference outputs for one prompt.
#[derive(Debug, Deserialize)]
pub struct GoldenResult {
    /// The prompt text.
    pub prompt: String,
    /// Its token ids.
    pub prompt_tokens: Vec<u32>,
    /// Greedy continuation under f64.
    pub f64_greedy_tokens: Vec<u32>,
    /// Top-5 `[id, logit]` at every position from the last prompt token on, teacher-forced
    /// along `prompt_tokens + f64_greedy_tokens`.
    pub f64_greedy_path_top5: Vec<Vec<(u32, f64)>>,
    /// Mean negative log-likelihood of prompt tokens 2..n, nats.
    pub f64_prompt_nll: f64,
}

impl Golden {
    /// Parses a golden file's text.
    pub fn parse(json: &str) -> Golden {
        serde_json::from_str(json).expect("golden file parses")
    }
}

impl GoldenResult {
    /// `prompt_tokens + f64_greedy_tokens`: the teacher-forced sequence.
    pub fn sequence(&self) -> Vec<u32> {
        let mut s = self.prompt_tokens.clone();
        s.extend(&self.f64_greedy_tokens);
        s
    }

    /// Checks `logits` (one row of `vocab` values per position of [`Self::sequence`]) against
    /// the f64 top-5 at every checked position, the argmax where the margin allows it, and
    /// the prompt NLL. Returns the largest |logit − f64| seen, or a message naming the first
    /// position that fails.
    pub fn check(
        &self,
        logits: &[f32],
        vocab: usize,
        tol: f64,
        nll_tol: f64,
    ) -> Result<f64, String> {
        let n = self.sequence().len();
        if logits.len() != n * vocab {
            return Err(format!(
                "expected {n} rows of {vocab} logits, got {} values",
                logits.len()
            ));
        }
        let row = |i: usize| &logits[i * vocab..(i + 1) * vocab];
        let first = self.prompt_tokens.len() - 1;
        let worst = self.check_path(&logits[first * vocab..], vocab, tol)?;
        let seq = self.sequence();
        let mut nll = 0.0f64;
        let count = self.prompt_tokens.len().saturating_sub(1);
        for i in 0..count {
            let r = row(i);
            let max = r.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
            let lse = max
                + r.iter()
                    .map(|&v| (f64::from(v) - max).exp())
                    .sum::<f64>()
                    .ln();
            nll += lse - f64::from(r[seq[i + 1] as usize]);
        }
        if count > 0 {
            let nll = nll / count as f64;
            if (nll - self.f64_prompt_nll).abs() > nll_tol {
                return Err(format!(
                    "{:?}: prompt NLL {nll} vs f64 {} (tolerance {nll_tol})",
                    self.prompt, self.f64_prompt_nll
                ));
            }
        }
        Ok(worst)
    }

    /// Checks the rows of the teacher-forced path from the last prompt token on (`logits`:
    /// one row of `vocab` values per position from there, as many as were computed) against
    /// the f64 top-5, and the argmax where the margin allows it. Returns the largest
    /// |logit − f64| seen.
    pub fn check_path(&self, logits: &[f32], vocab: usize, tol: f64) -> Result<f64, String> {
        self.check_path_from(logits, vocab, tol, 0)
    }

    /// [`Self::check_path`] from path row `skip` on: `logits` holds the rows of the positions
    /// from `prompt_tokens.len() - 1 + skip` on.
    pub fn check_path_from(
        &self,
        logits: &[f32],
        vocab: usize,
        tol: f64,
        skip: usize,
    ) -> Result<f64, String> {
        let first = self.prompt_tokens.len() - 1 + skip;
        let mut worst = 0.0f64;
        let rows = logits.len() / vocab;
        let path = self.f64_greedy_path_top5.iter().skip(skip);
        if path.len() < rows {
            return Err(format!(
                "{:?}: {rows} rows from path row {skip}, the golden has {}",
                self.prompt,
                self.f64_greedy_path_top5.len()
            ));
        }
        for (k, top5) in path.enumerate().take(rows) {
            let pos = first + k;
            let r = &logits[k * vocab..(k + 1) * vocab];
            for &(id, want) in top5 {
                let got = f64::from(r[id as usize]);
                let d = (got - want).abs();
                worst = worst.max(d);
                if d > tol {
                    return Err(format!(
                        "{:?}: position {pos}, token {id}: logit {got} vs f64 {want} (|Δ| {d:.2e} > {tol:.0e})",
                        self.prompt
                    ));
                }
            }
            if top5.len() >= 2 && top5[0].1 - top5[1].1 > 2.0 * tol {
                let argmax = r
                    .iter()
                    .enumerate()
                    .fold(
                        (0, f32::NEG_INFINITY),
                        |b, (i, &v)| if v > b.1 { (i, v) } else { b },
                    )
                    .0;
                if argmax as u32 != top5[0].0 {
                    return Err(format!(
                        "{:?}: position {pos}: argmax {argmax}, f64 says {}",
                        self.prompt, top5[0].0
                    ));
                }
            }
        }
        Ok(worst)
    }
}

/// Every fixture model (GGUF in every weight type, and the Hugging Face folders) and its
/// golden file.
pub const TINY_MODELS: &[(&str, &str)] = &[
    ("tiny-gpt2-f32.gguf", "tiny-gpt2-f32.golden.json"),
    ("tiny-gpt2-f16.gguf", "tiny-gpt2-f16.golden.json"),
    ("tiny-gpt2", "tiny-gpt2-f32.golden.json"),
    ("tiny-llama-f32.gguf", "tiny-llama-f32.golden.json"),
    ("tiny-llama-q8_0.gguf", "tiny-llama-q8_0.golden.json"),
    ("tiny-llama-q4_0.gguf", "tiny-llama-q4_0.golden.json"),
    ("tiny-llama-q4_1.gguf", "tiny-llama-q4_1.golden.json"),
    ("tiny-llama", "tiny-llama-f32.golden.json"),
    ("tiny-llama-256-f32.gguf", "tiny-llama-256-f32.golden.json"),
    (
        "tiny-llama-256-q4_k_m.gguf",
        "tiny-llama-256-q4_k_m.golden.json",
    ),
    (
        "tiny-llama-256-q5_k_m.gguf",
        "tiny-llama-256-q5_k_m.golden.json",
    ),
    (
        "tiny-llama-256-q6_k.gguf",
        "tiny-llama-256-q6_k.golden.json",
    ),
    ("tiny-llama-256", "tiny-llama-256-f32.golden.json"),
    ("tiny-llama-spm-f32.gguf", "tiny-llama-spm-f32.golden.json"),
    ("tiny-llama-spm", "tiny-llama-spm-f32.golden.json"),
    ("tiny-qwen2-f32.gguf", "tiny-qwen2-f32.golden.json"),
    ("tiny-qwen3-q8_0.gguf", "tiny-qwen3-q8_0.golden.json"),
    ("tiny-phi3-f32.gguf", "tiny-phi3-f32.golden.json"),
    ("tiny-gemma3-f32.gguf", "tiny-gemma3-f32.golden.json"),
    (
        "tiny-llama3-rope-f32.gguf",
        "tiny-llama3-rope-f32.golden.json",
    ),
];
