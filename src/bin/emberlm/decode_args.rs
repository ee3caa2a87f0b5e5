//! The decode-planning flags every subcommand takes: `--decode-plan auto|fixed|none` and the
//! values `fixed` uses or `auto` starts from.

use clap::Args;
use emberlm::engine::{LoadOptions, OptionValue};

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
    /// Puts the flags given into `o` (checked there with every other surface's options).
    pub fn fill(&self, o: &mut LoadOptions) -> emberlm::Result<()> {
        let whole = |n: Option<u32>| n.map(|n| OptionValue::Whole(u64::from(n)));
        let given = [
            (
                "--decode-plan",
                self.decode_plan.clone().map(OptionValue::Text),
            ),
            ("--decode-q-chunk", whole(self.decode_q_chunk)),
            ("--decode-local-window", whole(self.decode_local_window)),
            ("--decode-bucket-short", whole(self.decode_bucket_short)),
            ("--decode-bucket-mid", whole(self.decode_bucket_mid)),
        ];
        for (flag, value) in given {
            if let Some(value) = value {
                o.set(flag, value)?;
            }
        }
        Ok(())
    }
}
