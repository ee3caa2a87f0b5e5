//! Calls in a chat answer, OpenAI-shaped: `message.tool_calls` and `finish_reason:
//! "tool_calls"` in the whole response, `delta.tool_calls` chunks in a stream (one chunk per
//! call, sent as soon as its text is complete; content before the calls streams as it comes).

use serde_json::{json, Value};

use crate::chat::tool_calls::{read_calls, CallStream, ParsedCall};
use crate::chat::tools::ToolSyntax;
use crate::session::Generation;

/// One request's calls: the syntax its answers are held to, and each choice's stream state.
#[derive(Clone, Debug)]
pub struct ToolReply {
    syntax: ToolSyntax,
    /// The response id's random part: call ids are `call_<it>_<choice>_<k>`, or for Mistral's
    /// syntaxes nine letters and digits (its templates refuse any other id in the history):
    /// five of it, then the choice and the call in two base-36 digits each.
    stem: String,
    streams: Vec<CallStream>,
    /// Calls sent so far, per choice.
    sent: Vec<usize>,
}

/// A call as OpenAI writes it in `tool_calls`.
fn call_value(id: &str, call: &ParsedCall) -> Value {
    json!({
        "id": id,
        "type": "function",
        "function": { "name": call.name, "arguments": call.arguments },
    })
}

/// The base-36 digit of `n` (below 36).
fn base36(n: usize) -> char {
    char::from_digit(n as u32 % 36, 36).unwrap_or('0')
}

impl ToolReply {
    /// The reply of response `response_id` with `choices` choices in `syntax`.
    pub fn new(syntax: ToolSyntax, response_id: &str, choices: usize) -> Self {
        let stem = response_id
            .rsplit('-')
            .next()
            .unwrap_or(response_id)
            .to_string();
        Self {
            syntax,
            stem,
            streams: vec![CallStream::new(syntax); choices],
            sent: vec![0; choices],
        }
    }

    fn id(&self, choice: usize, k: usize) -> String {
        match self.syntax {
            ToolSyntax::Mistral | ToolSyntax::MistralArgs => {
                let mut id: String = self
                    .stem
                    .chars()
                    .filter(char::is_ascii_alphanumeric)
                    .take(5)
                    .collect();
                while id.len() < 5 {
                    id.push('0');
                }
                for n in [choice, k] {
                    let n = n % (36 * 36);
                    id.extend([base36(n / 36), base36(n % 36)]);
                }
                id
            }
            ToolSyntax::Hermes | ToolSyntax::Llama3 => {
                format!("call_{}_{choice}_{k}", self.stem)
            }
        }
    }

    fn stream(&mut self, choice: usize) -> &mut CallStream {
        if self.streams.len() <= choice {
            self.streams
                .resize(choice + 1, CallStream::new(self.syntax));
            self.sent.resize(choice + 1, 0);
        }
        &mut self.streams[choice]
    }

    /// Streams `text` of `choice`: the content to send now, and the calls completed, each
    /// as a `tool_calls` delta item (`index`, `id`, `type`, `function`).
    pub fn push(&mut self, choice: usize, text: &str) -> (String, Vec<Value>) {
        let piece = self.stream(choice).push(text);
        let items = self.items(choice, &piece.calls);
        (piece.content, items)
    }

    /// The end of `choice`'s answer: held content and a last call.
    pub fn finish(&mut self, choice: usize) -> (String, Vec<Value>) {
        let piece = self.stream(choice).finish();
        let items = self.items(choice, &piece.calls);
        (piece.content, items)
    }

    fn items(&mut self, choice: usize, calls: &[ParsedCall]) -> Vec<Value> {
        let mut out = Vec::with_capacity(calls.len());
        for call in calls {
            let k = self.sent[choice];
            let mut item = call_value(&self.id(choice, k), call);
            item["index"] = json!(k);
            out.push(item);
            self.sent[choice] += 1;
        }
        out
    }

    /// Whether `choice` streamed any call.
    pub fn called(&self, choice: usize) -> bool {
        self.sent.get(choice).is_some_and(|&n| n > 0)
    }

    /// Rewrites the whole response `whole` of `g`: each choice whose text holds calls gets
    /// `message.tool_calls` (its `content` the text before them, `null` when there is none)
    /// and `finish_reason: "tool_calls"` where it stopped on its own.
    pub fn rewrite(&self, whole: &mut Value, g: &Generation) {
        for (i, s) in g.sequences.iter().enumerate() {
            let read = read_calls(&s.text, self.syntax);
            if read.calls.is_empty() {
                continue;
            }
            let Some(choice) = whole["choices"].get_mut(i) else {
                continue;
            };
            let calls: Vec<Value> = read
                .calls
                .iter()
                .enumerate()
                .map(|(k, c)| call_value(&self.id(i, k), c))
                .collect();
            choice["message"]["content"] = match read.content.is_empty() {
                true => Value::Null,
                false => read.content.into(),
            };
            choice["message"]["tool_calls"] = Value::Array(calls);
            if choice["finish_reason"] == "stop" {
                choice["finish_reason"] = "tool_calls".into();
            }
        }
    }
}
