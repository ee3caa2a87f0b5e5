//! The response-format flags of `generate`, `chat` and `batch`: at most one of
//! `--json-object`, `--json-schema FILE`, `--regex RE`, `--lark FILE`, `--gbnf FILE`.

use std::path::PathBuf;

use clap::Args;
use emberlm::constrain::ResponseFormat;

use crate::cli::read_text;
use crate::{CliResult, Failure};

/// What shape the generated text must have.
#[derive(Debug, Clone, Default, Args)]
#[group(id = "format", multiple = false)]
pub struct FormatArgs {
    /// The text is one JSON object (any keys).
    #[arg(long = "json-object", alias = "json_object")]
    pub json_object: bool,
    /// The text is JSON valid under the JSON schema in FILE.
    #[arg(long = "json-schema", alias = "json_schema", value_name = "FILE")]
    pub json_schema: Option<PathBuf>,
    /// The text matches the regular expression RE (Rust regex syntax, whole text).
    #[arg(long, value_name = "RE")]
    pub regex: Option<String>,
    /// The text follows the Lark grammar in FILE (start rule `start`).
    #[arg(long, value_name = "FILE")]
    pub lark: Option<PathBuf>,
    /// The text follows the llama.cpp GBNF grammar in FILE (start rule `root`).
    #[arg(long, value_name = "FILE")]
    pub gbnf: Option<PathBuf>,
}

impl FormatArgs {
    /// The format the flags ask for (free text without one); unreadable files and schemas
    /// that are not JSON are usage errors.
    pub fn format(&self) -> CliResult<ResponseFormat> {
        if self.json_object {
            return Ok(ResponseFormat::JsonObject);
        }
        if let Some(path) = &self.json_schema {
            let text = read_text(path)?;
            let schema = serde_json::from_str(&text).map_err(|e| {
                Failure::usage(format!("`{}` is not a JSON schema: {e}", path.display()))
            })?;
            return Ok(ResponseFormat::JsonSchema {
                schema,
                strict: true,
            });
        }
        if let Some(rx) = &self.regex {
            return Ok(ResponseFormat::Regex(rx.clone()));
        }
        if let Some(path) = &self.lark {
            return Ok(ResponseFormat::Lark(read_text(path)?));
        }
        if let Some(path) = &self.gbnf {
            return Ok(ResponseFormat::Gbnf(read_text(path)?));
        }
        Ok(ResponseFormat::Text)
    }
}
