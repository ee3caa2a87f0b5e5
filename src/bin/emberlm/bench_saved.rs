//! The bench's saved-conversation section: the time to the first token of a turn that follows a
//! long conversation, when the conversation is recomputed from its tokens (what a reload costs
//! without a saved state) against restored from the bytes `Session::save_state` wrote (the
//! restore's own time included), on the session's backend.

use std::time::Instant;

use emberlm::session::{Prompt, Session};
use serde_json::{json, Value};

use crate::bench_common::{greedy_forever, prompt_tokens, Spread};
use crate::CliResult;

/// Tokens of the new turn after the conversation.
const TURN: usize = 8;

/// Measures `runs` times, alternating: a `tokens`-token conversation then a short turn,
/// recomputed from an empty cache, and restored from its saved bytes. Returns the JSON section
/// ([`print`] writes its lines).
pub fn saved_conversation(session: &mut Session, tokens: usize, runs: usize) -> CliResult<Value> {
    let conversation = prompt_tokens(session, tokens)?;
    let mut turn = conversation.clone();
    turn.extend(prompt_tokens(session, TURN)?);
    let first_token = |s: &mut Session| -> CliResult<f64> {
        let opts = greedy_forever(s, 1);
        let g = pollster::block_on(s.generate(&Prompt::Tokens(turn.clone()), &opts, &mut |_| {}))?;
        Ok(g.stats.time_to_first_token_ms)
    };
    // the saved state: the conversation read once
    session.reset();
    let opts = greedy_forever(session, 1);
    pollster::block_on(session.generate(
        &Prompt::Tokens(conversation.clone()),
        &opts,
        &mut |_| {},
    ))?;
    let start = Instant::now();
    let bytes = pollster::block_on(session.save_state(None))?;
    let save_ms = start.elapsed().as_secs_f64() * 1000.0;
    let (mut recomputed, mut restored, mut restore_ms) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs.max(1) {
        session.reset();
        recomputed.push(first_token(session)?);
        session.reset();
        let start = Instant::now();
        pollster::block_on(session.restore_state(&bytes, "the bench's saved conversation"))?;
        let restore = start.elapsed().as_secs_f64() * 1000.0;
        restore_ms.push(restore);
        restored.push(restore + first_token(session)?);
    }
    let (recomputed, restored) = (Spread::of(&recomputed), Spread::of(&restored));
    let speedup = recomputed.median / restored.median.max(1e-9);
    Ok(json!({
        "conversation_tokens": tokens,
        "turn_tokens": TURN,
        "state_bytes": bytes.len(),
        "save_ms": save_ms,
        "restore_ms": Spread::of(&restore_ms),
        "ttft_recomputed_ms": recomputed,
        "ttft_restored_ms": restored,
        "speedup": speedup,
    }))
}

/// The section's lines of the table.
pub fn print(v: &Value) {
    if v.is_null() {
        return;
    }
    let tokens = &v["conversation_tokens"];
    let spread = |k: &str| {
        format!(
            "{:.1} (min {:.1}, max {:.1})",
            v[k]["median"].as_f64().unwrap_or(0.0),
            v[k]["min"].as_f64().unwrap_or(0.0),
            v[k]["max"].as_f64().unwrap_or(0.0)
        )
    };
    for (k, what) in [
        ("ttft_recomputed_ms", "recomputed"),
        ("ttft_restored_ms", "restored"),
    ] {
        println!(
            "{:<44}{}",
            format!("first token after {tokens} tokens, {what} (ms)"),
            spread(k)
        );
    }
    println!(
        "  saved state {:.1} MiB, saved in {:.1} ms; restored {:.1}× sooner",
        v["state_bytes"].as_f64().unwrap_or(0.0) / f64::from(1 << 20),
        v["save_ms"].as_f64().unwrap_or(0.0),
        v["speedup"].as_f64().unwrap_or(0.0)
    );
}
