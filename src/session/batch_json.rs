//! A batch given as JSON (JavaScript's `generateBatch`): prompts, or `{ prompt, ...options }`
//! objects whose options replace the shared ones, and the shared options with `maxBatch`.

use serde_json::Value;

use super::{BatchItem, GenerateOptions, GivenOptions, Prompt};
use crate::error::Error;
use crate::option_keys::normalized;

/// The items of a batch and the most sequences per step: `prompts` is a JSON array whose
/// elements are prompts, or objects `{ prompt, ...options }` whose options replace those of
/// `options` for that prompt; `options` may hold `maxBatch` besides the generation options.
pub fn parse_batch(
    prompts: &str,
    options: &str,
) -> crate::error::Result<(Vec<BatchItem>, Option<usize>)> {
    let bad = |what: &'static str, m: String| Error::invalid(what, m);
    let prompts: Value =
        serde_json::from_str(prompts).map_err(|e| bad("prompts", e.to_string()))?;
    let Value::Array(prompts) = prompts else {
        return Err(bad("prompts", "must be an array of prompts".into()));
    };
    if prompts.is_empty() {
        return Err(bad("prompts", "must hold at least one prompt".into()));
    }
    let mut base = match serde_json::from_str(options).map_err(|e| bad("options", e.to_string()))? {
        Value::Null => serde_json::Map::new(),
        Value::Object(map) => map,
        _ => return Err(bad("options", "must be an object".into())),
    };
    let max_batch = match base.keys().find(|k| normalized(k) == "maxbatch").cloned() {
        None => None,
        Some(k) => match base.remove(&k).unwrap_or_default() {
            Value::Null => None,
            v => match v.as_u64() {
                Some(n) if n >= 1 => Some(n as usize),
                _ => {
                    return Err(bad(
                        "maxBatch",
                        format!("must be a whole number ≥ 1, got {v}"),
                    ))
                }
            },
        },
    };
    let base = GivenOptions::from_map(&base)?;
    let items = prompts
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let at = |e: Error| bad("prompts", format!("prompts[{i}]: {e}"));
            let (prompt, given) = match p {
                Value::Object(mut own) if own.contains_key("prompt") => {
                    let prompt = own.remove("prompt").unwrap_or_default();
                    let own = GivenOptions::from_map(&own).map_err(at)?;
                    (prompt, own.over(&base))
                }
                other => (other, base.clone()),
            };
            let prompt = Prompt::from_json(&prompt.to_string()).map_err(at)?;
            let mut options = GenerateOptions::default();
            given.apply(&mut options).map_err(at)?;
            // ranges checked here too, so that the error names the item
            options.validate().map_err(at)?;
            Ok(BatchItem { prompt, options })
        })
        .collect::<crate::error::Result<Vec<_>>>()?;
    Ok((items, max_batch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_take_their_own_options_over_the_shared_ones() {
        let (items, max) = parse_batch(
            r#"["a", {"prompt": [1, 2], "temperature": 0.5, "maxNewTokens": 3}]"#,
            r#"{"max_new_tokens": 9, "maxBatch": 4}"#,
        )
        .unwrap();
        assert_eq!(max, Some(4));
        assert_eq!(items[0].prompt, Prompt::Text("a".into()));
        assert_eq!(items[0].options.sampling.max_new_tokens, 9);
        assert_eq!(items[1].prompt, Prompt::Tokens(vec![1, 2]));
        assert_eq!(items[1].options.sampling.max_new_tokens, 3);
        assert_eq!(items[1].options.sampling.temperature, 0.5);
    }

    #[test]
    fn a_bad_item_is_named_by_its_index() {
        let e = parse_batch(r#"["a", {"prompt": "b", "top_k": -1}]"#, "null").unwrap_err();
        assert!(e.to_string().contains("prompts[1]"), "{e}");
        let e = parse_batch("[]", "null").unwrap_err();
        assert!(e.to_string().contains("at least one"), "{e}");
        let e = parse_batch(r#"["a"]"#, r#"{"maxBatch": 0}"#).unwrap_err();
        assert!(e.to_string().contains("maxBatch"), "{e}");
    }
}
