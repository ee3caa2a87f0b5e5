//! The KV-cache flags every subcommand takes: the kinds (`--kv-cache`, `--k-cache`,
//! `--v-cache`) or `--kv-cache auto` with the automatic plan's settings, and what `info`
//! prints of the plan's decision.

use clap::Args;
use emberlm::dtype::kv::{KvKind, KvKinds};
use emberlm::engine::{LoadOptions, OptionValue};
use emberlm::session::CacheDecision;

/// KV-cache flags (global: accepted by every subcommand).
#[derive(Debug, Args, Clone, Default)]
pub struct KvArgs {
    /// How the KV cache stores K and V: f32 (exact, the default), f16, q8_0, q4_0 or nf4
    /// (blocks of 32 with a scale; about 2×, 3.8× and 7× smaller than f32), or `auto`:
    /// measured on this device under --cache-budget-mb and the quality gates, and kept.
    #[arg(long = "kv-cache", global = true, value_name = "KIND|auto")]
    pub kv_cache: Option<String>,
    /// The K cache's kind alone (overrides --kv-cache for K).
    #[arg(long = "k-cache", global = true, value_name = "KIND")]
    pub k_cache: Option<String>,
    /// The V cache's kind alone (overrides --kv-cache for V).
    #[arg(long = "v-cache", global = true, value_name = "KIND")]
    pub v_cache: Option<String>,
    /// The largest KV cache allowed, MiB: with --kv-cache auto kinds over it are dropped; with
    /// a fixed kind the context must fit it.
    #[arg(long = "cache-budget-mb", global = true, value_name = "MIB")]
    pub cache_budget_mb: Option<f64>,
    /// Calibration prompt, tokens (default 64).
    #[arg(
        long = "cache-quality-prompt-len",
        global = true,
        value_name = "N",
        help_heading = "KV cache plan (--kv-cache auto)"
    )]
    pub cache_quality_prompt_len: Option<usize>,
    /// Calibration tokens decoded one at a time (default 4).
    #[arg(
        long = "cache-quality-decode-steps",
        global = true,
        value_name = "N",
        help_heading = "KV cache plan (--kv-cache auto)"
    )]
    pub cache_quality_decode_steps: Option<usize>,
    /// Largest mean NLL increase over f32 (default 0.05).
    #[arg(
        long = "cache-quality-max-delta-nll",
        global = true,
        value_name = "X",
        help_heading = "KV cache plan (--kv-cache auto)"
    )]
    pub cache_quality_max_delta_nll: Option<f64>,
    /// Largest perplexity ratio to f32 (default 1.05).
    #[arg(
        long = "cache-quality-max-ppl-ratio",
        global = true,
        value_name = "X",
        help_heading = "KV cache plan (--kv-cache auto)"
    )]
    pub cache_quality_max_ppl_ratio: Option<f64>,
    /// Largest mean KL divergence on the needle probe (default 0.1).
    #[arg(
        long = "cache-quality-max-mean-kl",
        global = true,
        value_name = "X",
        help_heading = "KV cache plan (--kv-cache auto)"
    )]
    pub cache_quality_max_mean_kl: Option<f64>,
    /// Time the kinds that pass and keep the fastest (default true; false keeps the smallest).
    #[arg(
        long = "cache-auto-benchmark",
        global = true,
        value_name = "BOOL",
        help_heading = "KV cache plan (--kv-cache auto)"
    )]
    pub cache_auto_benchmark: Option<bool>,
    /// Decode steps timed per kind (default 8).
    #[arg(
        long = "cache-auto-bench-steps",
        global = true,
        value_name = "N",
        help_heading = "KV cache plan (--kv-cache auto)"
    )]
    pub cache_auto_bench_steps: Option<usize>,
    /// Prompt before the timed steps, tokens (default 64).
    #[arg(
        long = "cache-auto-bench-prompt-len",
        global = true,
        value_name = "N",
        help_heading = "KV cache plan (--kv-cache auto)"
    )]
    pub cache_auto_bench_prompt_len: Option<usize>,
    /// Folder of the stored decisions (default: the user's cache directory).
    #[arg(
        long = "cache-plan-path",
        global = true,
        value_name = "DIR",
        help_heading = "KV cache plan (--kv-cache auto)"
    )]
    pub cache_plan_path: Option<String>,
    /// Measure again when the stored decision is older than the interval (default true).
    #[arg(
        long = "cache-plan-probe",
        global = true,
        value_name = "BOOL",
        help_heading = "KV cache plan (--kv-cache auto)"
    )]
    pub cache_plan_probe: Option<bool>,
    /// Age after which a stored decision is measured again, seconds (default 3600).
    #[arg(
        long = "cache-plan-probe-interval-sec",
        global = true,
        value_name = "SECONDS",
        help_heading = "KV cache plan (--kv-cache auto)"
    )]
    pub cache_plan_probe_interval_sec: Option<u64>,
}

impl KvArgs {
    /// Puts the flags given into `o` (checked there with every other surface's options).
    pub fn fill(&self, o: &mut LoadOptions) -> emberlm::Result<()> {
        let text = |s: &Option<String>| s.clone().map(OptionValue::Text);
        let number = |n: Option<f64>| n.map(OptionValue::Number);
        let whole = |n: Option<usize>| n.map(|n| OptionValue::Whole(n as u64));
        let flag = |b: Option<bool>| b.map(OptionValue::Flag);
        let given = [
            ("--kv-cache", text(&self.kv_cache)),
            ("--k-cache", text(&self.k_cache)),
            ("--v-cache", text(&self.v_cache)),
            ("--cache-budget-mb", number(self.cache_budget_mb)),
            (
                "--cache-quality-prompt-len",
                whole(self.cache_quality_prompt_len),
            ),
            (
                "--cache-quality-decode-steps",
                whole(self.cache_quality_decode_steps),
            ),
            (
                "--cache-quality-max-delta-nll",
                number(self.cache_quality_max_delta_nll),
            ),
            (
                "--cache-quality-max-ppl-ratio",
                number(self.cache_quality_max_ppl_ratio),
            ),
            (
                "--cache-quality-max-mean-kl",
                number(self.cache_quality_max_mean_kl),
            ),
            ("--cache-auto-benchmark", flag(self.cache_auto_benchmark)),
            (
                "--cache-auto-bench-steps",
                whole(self.cache_auto_bench_steps),
            ),
            (
                "--cache-auto-bench-prompt-len",
                whole(self.cache_auto_bench_prompt_len),
            ),
            ("--cache-plan-path", text(&self.cache_plan_path)),
            ("--cache-plan-probe", flag(self.cache_plan_probe)),
            (
                "--cache-plan-probe-interval-sec",
                self.cache_plan_probe_interval_sec.map(OptionValue::Whole),
            ),
        ];
        for (flag, value) in given {
            if let Some(value) = value {
                o.set(flag, value)?;
            }
        }
        Ok(())
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// The decision as text: the chosen kind, why, and each kind's measurements.
pub fn describe(d: &CacheDecision) -> String {
    let mut out = format!(
        "KV cache plan: {} ({}, context {}, budget {})\n",
        d.kind,
        d.source,
        d.context,
        d.budget_mb.map_or("none".into(), |b| format!("{b} MiB"))
    );
    for c in &d.candidates {
        let num = |v: Option<f64>, digits: usize| v.map_or("-".into(), |x| format!("{x:.digits$}"));
        out.push_str(&format!(
            "  {:<5} {:>10} ({} B/token)  ΔNLL {}  PPL ratio {}  KL {}  decode {} tok/s  {}\n",
            c.kind,
            mib(c.bytes),
            c.bytes_per_token,
            num(c.delta_nll, 4),
            num(c.ppl_ratio, 4),
            num(c.mean_kl, 4),
            num(c.decode_tok_s, 1),
            c.dropped
                .as_deref()
                .map_or("passed".into(), |r| format!("dropped: {r}"))
        ));
    }
    if let Some(n) = &d.notice {
        out.push_str(&format!("  note: {n}\n"));
    }
    if let Some(at) = &d.stored_at {
        out.push_str(&format!("  stored at {at}\n"));
    }
    out
}

/// Bytes per token of every kind, for `info`.
pub fn per_kind_bytes(layers: usize, kv_dim: usize) -> String {
    KvKind::ALL
        .iter()
        .map(|&k| format!("{k} {}", KvKinds::both(k).bytes_per_token(layers, kv_dim)))
        .collect::<Vec<_>>()
        .join(", ")
}
