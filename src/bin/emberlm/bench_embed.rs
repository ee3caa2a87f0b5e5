//! The bench's embeddings section (`--embed-texts N`): N texts of a few sentences each embedded
//! on the session's backend (`Session::embed`, mean pooling, unit vectors), texts per second
//! in alternating runs beside llama.cpp's embedding mode on the same file and texts
//! (`tools/bench_llama_cpp_embed.py`), and how close the two sets of vectors are (the lowest
//! cosine similarity over the texts).

use std::path::Path;
use std::time::Instant;

use emberlm::session::{EmbedOptions, Pooling, Session};
use serde_json::{json, Value};

use crate::bench_common::{python_request, Spread};
use crate::CliResult;

/// Sentences the texts are made of, each text a different rotation of them.
const SENTENCES: [&str; 6] = [
    "The model runs in the page on the user's own device.",
    "Nothing is sent to a server, and nothing needs to be installed.",
    "A search box ranks the passages closest in meaning to the question.",
    "Each passage is read once and kept as one vector of the model's width.",
    "Similar texts point in similar directions, so a dot product compares them.",
    "Long documents are cut into passages that fit the model's context.",
];

/// The `i`-th bench text: three sentences, numbered so that no two texts are equal.
fn text(i: usize) -> String {
    let pick = |k: usize| SENTENCES[(i + k) % SENTENCES.len()];
    format!("Passage {i}. {} {} {}", pick(0), pick(2), pick(4))
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * y).sum();
    let na = a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let nb = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    dot / (na * nb).max(1e-30)
}

/// Measures `runs` times, alternating ours and llama.cpp's (when `python` is given); returns the
/// JSON section ([`print`] writes its lines).
pub fn embeddings(
    session: &mut Session,
    model: &Path,
    count: usize,
    runs: usize,
    python: Option<&Path>,
    threads: usize,
) -> CliResult<Value> {
    let texts: Vec<String> = (0..count).map(text).collect();
    // mean pooling on both sides (llama.cpp is asked for it too)
    let options = EmbedOptions {
        pooling: Some(Pooling::Mean),
        ..EmbedOptions::default()
    };
    let (mut ours, mut theirs, mut llama) = (Vec::new(), Vec::new(), None);
    let mut llama_error = python.is_none().then(|| "not asked for".to_string());
    let mut vectors = Vec::new();
    let mut tokens = 0;
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        let e = pollster::block_on(session.embed(&texts, &options))?;
        ours.push(texts.len() as f64 / start.elapsed().as_secs_f64());
        tokens = e.tokens.iter().sum::<usize>();
        vectors = e.vectors;
        if let (Some(py), None) = (python, &llama_error) {
            let request = json!({ "model": model, "texts": texts, "pooling": "mean",
                                  "threads": threads });
            match python_request(py, "tools/bench_llama_cpp_embed.py", &request) {
                Ok(v) => {
                    theirs.extend(v["texts_per_s"].as_f64());
                    llama = Some(v);
                }
                Err(e) => llama_error = Some(e),
            }
        }
    }
    let ours = Spread::of(&ours);
    let peer = match &llama {
        None => json!({ "available": false, "reason": llama_error }),
        Some(v) => {
            let lowest = v["vectors"]
                .as_array()
                .map(|theirs| {
                    theirs
                        .iter()
                        .zip(&vectors)
                        .map(|(t, o)| {
                            let t: Vec<f64> = serde_json::from_value(t.clone()).unwrap_or_default();
                            cosine(o, &t)
                        })
                        .fold(f64::INFINITY, f64::min)
                })
                .unwrap_or(f64::NAN);
            let theirs = Spread::of(&theirs);
            json!({
                "available": true,
                "version": v["version"],
                "tokens": v["tokens"],
                "texts_per_s": theirs,
                "ratio_ours_over_theirs": ours.median / theirs.median,
                "lowest_cosine_ours_vs_theirs": lowest,
                "error_after_some_runs": llama_error,
            })
        }
    };
    Ok(json!({
        "texts": count,
        "tokens": tokens,
        "pooling": options.pooling,
        "texts_per_s": ours,
        "llama_cpp": peer,
    }))
}

/// The section's lines of the table.
pub fn print(v: &Value) {
    if v.is_null() {
        return;
    }
    let spread = |s: &Value| {
        format!(
            "{:.1} (min {:.1}, max {:.1})",
            s["median"].as_f64().unwrap_or(0.0),
            s["min"].as_f64().unwrap_or(0.0),
            s["max"].as_f64().unwrap_or(0.0)
        )
    };
    let what = format!(
        "embed {} texts, {} tokens (texts/s)",
        v["texts"], v["tokens"]
    );
    println!("{what:<44}{}", spread(&v["texts_per_s"]));
    let peer = &v["llama_cpp"];
    if peer["available"] == true {
        println!(
            "{:<44}{}  (ours / theirs {:.2}; lowest cosine {:.5})",
            format!("  llama.cpp embedding mode, {} tokens", peer["tokens"]),
            spread(&peer["texts_per_s"]),
            peer["ratio_ours_over_theirs"].as_f64().unwrap_or(0.0),
            peer["lowest_cosine_ours_vs_theirs"].as_f64().unwrap_or(0.0)
        );
    }
}
