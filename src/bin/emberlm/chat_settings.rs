//! The sampling settings `emberlm chat` changes with a command (`/temp 0.7`, `/top_k 40`, ...):
//! each command's parameter, its value as shown, and a new value parsed and checked.

use emberlm::sampling::SamplingParams;

/// The parameter a setting command changes (its SamplingParams name).
pub fn parameter(command: &str) -> Option<&'static str> {
    Some(match command {
        "temp" | "temperature" => "temperature",
        "top_k" => "top_k",
        "top_p" => "top_p",
        "min_p" => "min_p",
        "typical_p" => "typical_p",
        "rep_pen" | "repetition_penalty" => "repetition_penalty",
        "max_tokens" | "max_new_tokens" => "max_new_tokens",
        "seed" => "seed",
        _ => return None,
    })
}

/// The current value of a parameter named by [`parameter`].
pub fn value_of(p: &SamplingParams, name: &str) -> String {
    match name {
        "temperature" => p.temperature.to_string(),
        "top_k" => p.top_k.to_string(),
        "top_p" => p.top_p.to_string(),
        "min_p" => p.min_p.to_string(),
        "typical_p" => p.typical_p.to_string(),
        "repetition_penalty" => p.repetition_penalty.to_string(),
        "max_new_tokens" => p.max_new_tokens.to_string(),
        "seed" => p
            .seed
            .map_or_else(|| "random".to_string(), |s| s.to_string()),
        _ => String::new(),
    }
}

/// Parses `value` into `slot`; the error names the parameter.
fn parse_into<T: std::str::FromStr>(slot: &mut T, name: &str, value: &str) -> Result<(), String> {
    *slot = value
        .parse()
        .map_err(|_| format!("invalid {name}: `{value}` is not a valid value"))?;
    Ok(())
}

/// `params` with `name` set to `value`, validated; the error names the parameter.
pub fn with_value(
    params: &SamplingParams,
    name: &str,
    value: &str,
) -> Result<SamplingParams, String> {
    let mut p = params.clone();
    match name {
        "temperature" => parse_into(&mut p.temperature, name, value)?,
        "top_k" => parse_into(&mut p.top_k, name, value)?,
        "top_p" => parse_into(&mut p.top_p, name, value)?,
        "min_p" => parse_into(&mut p.min_p, name, value)?,
        "typical_p" => parse_into(&mut p.typical_p, name, value)?,
        "repetition_penalty" => parse_into(&mut p.repetition_penalty, name, value)?,
        "max_new_tokens" => parse_into(&mut p.max_new_tokens, name, value)?,
        "seed" if value == "random" => p.seed = None,
        "seed" => {
            let mut seed = 0u64;
            parse_into(&mut seed, name, value)?;
            p.seed = Some(seed);
        }
        _ => return Err(format!("unknown parameter {name}")),
    }
    p.validate().map_err(|e| e.to_string())?;
    Ok(p)
}
