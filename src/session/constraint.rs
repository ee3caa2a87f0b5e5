//! The constraint of one call: its response format, or the grammar of the tools it lets the
//! model call (the loaded template's call syntax, each function's schema), compiled for this
//! model's vocabulary.

use std::sync::Arc;

use super::{GenerateOptions, Session};
use crate::chat::{tool_calls, ToolFormat, ToolRequest};
use crate::constrain::{Constraint, Grammars, ResponseFormat};
use crate::error::{Error, Result};

impl Session {
    /// `options`' response format compiled for this model (`None`: free text).
    pub(super) fn constraint(&mut self, options: &GenerateOptions) -> Result<Option<Constraint>> {
        let syntax = self.template.tool_format().syntax;
        let calls = options.tools.as_ref().and_then(|t| {
            let ids = |marker: &str| self.tokenizer.control_token(marker);
            Some((t, tool_calls::grammar(t, syntax, &ids)?))
        });
        let format = match &calls {
            Some((_, lark)) => &ResponseFormat::Lark(lark.clone()),
            None => &options.response_format,
        };
        if !format.is_constrained() {
            return Ok(None);
        }
        let grammars = match &self.grammars {
            Some(g) => Arc::clone(g),
            None => {
                let eos = self.eos.first().copied().unwrap_or(0);
                let g = Arc::new(Grammars::new(&self.tokenizer, self.vocab(), eos)?);
                self.grammars = Some(Arc::clone(&g));
                g
            }
        };
        match (grammars.compile(format), calls) {
            (Err(e), Some((tools, _))) => Err(tool_error(&grammars, tools, e)),
            (Ok(c), Some(_)) => Ok(c.map(|c| c.named("tool call"))),
            (result, None) => result,
        }
    }

    /// How this model's chat template takes tools (`info().toolFormat`).
    pub fn tool_format(&self) -> ToolFormat {
        self.template.tool_format()
    }
}

/// The error for tools whose grammar does not compile: the first function whose parameters do
/// not compile alone, named; else the grammar's own error.
fn tool_error(grammars: &Grammars, tools: &ToolRequest, e: Error) -> Error {
    for (i, def) in tools.tools.iter().enumerate() {
        let alone = ResponseFormat::JsonSchema {
            schema: def.parameters.clone(),
            strict: def.strict,
        };
        if let Err(own) = grammars.compile(&alone) {
            let why = match own {
                Error::InvalidArgument { message, .. } => message,
                other => other.to_string(),
            };
            return Error::invalid(
                "tools",
                format!(
                    "tools[{i}] (`{}`): its parameters are not a schema calls can be held to: {why}",
                    def.name
                ),
            );
        }
    }
    e
}
