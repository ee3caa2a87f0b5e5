//! The decode-planning flags every subcommand takes: `--decode-plan auto|fixed|none` and the
//! values `fixed` uses or `auto` starts from.

use clap::Args;
use emberlm::gpu::{DecodePlan, DecodePlanMode};

use crate::Failure;

/// Decode-planning flags (global: accepted by every subcommand).
#[derive(Debug, Args, Clone, Default)]
pub struct DecodeArgs {
    /// How attention reads long contexts: `auto` (default: key blocks chosen by context bucket,
    /// the trained local window), `fixed` (--decode-q-chunk and --decode-local-window as given)
    /// or `none` (every key in one block). Results are the same to float rounding.
    #[arg(
        long = "decode-plan",
        global = true,
        value_name = "auto|fixed|none",
        help_heading = "Decode planning"
    )]
    pub decode_plan: Option<String>,
    /// Keys per attention block with --decode-plan fixed.
    #[arg(
        long = "decode-q-chunk",
        global = true,
        value_name = "KEYS",
        help_heading = "Decode planning"
    )]
    pub decode_q_chunk: Option<u32>,
    /// Latest keys a local-attention layer reads with --decode-plan fixed (models trained
    /// with local attention only).
    #[arg(
        long = "decode-local-window",
        global = true,
        value_name = "KEYS",
        help_heading = "Decode planning"
    )]
    pub decode_local_window: Option<u32>,
    /// End of the short bucket, keys (default 512): shorter contexts run whole.
    #[arg(
        long = "decode-bucket-short",
        global = true,
        value_name = "KEYS",
        help_heading = "Decode planning"
    )]
    pub decode_bucket_short: Option<u32>,
    /// End of the middle bucket, keys (default 2048): longer contexts use longer blocks.
    #[arg(
        long = "decode-bucket-mid",
        global = true,
        value_name = "KEYS",
        help_heading = "Decode planning"
    )]
    pub decode_bucket_mid: Option<u32>,
}

impl DecodeArgs {
    /// The decode plan the flags describe; inconsistent flags are a usage error naming them.
    pub fn resolve(&self) -> Result<DecodePlan, Failure> {
        let d = DecodePlan::default();
        let mode = match &self.decode_plan {
            Some(s) => s
                .parse::<DecodePlanMode>()
                .map_err(|e| Failure::usage(format!("--decode-plan: {e}")))?,
            None => d.mode,
        };
        let plan = DecodePlan {
            mode,
            q_chunk: self.decode_q_chunk,
            local_window: self.decode_local_window,
            bucket_short: self.decode_bucket_short.unwrap_or(d.bucket_short),
            bucket_mid: self.decode_bucket_mid.unwrap_or(d.bucket_mid),
        };
        plan.validate()
            .map_err(|e| Failure::usage(e.to_string().replace('_', "-")))?;
        Ok(plan)
    }
}
