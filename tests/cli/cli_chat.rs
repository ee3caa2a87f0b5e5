//! `emberlm chat` driven through a pipe: commands, replies, history, exit paths, Ctrl-C.

#![cfg(not(target_arch = "wasm32"))]

use crate::common::require;

use std::io::{Read, Write};
use std::process::{Command, Stdio};

const LLAMA: &str = "tests/fixtures/tiny-llama-q4_1.gguf";
const GPT2: &str = "tests/fixtures/tiny-gpt2";

fn emberlm() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emberlm"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
    // the adapter, even a software one: these tests check the GPU path
    cmd.env("EMBERLM_DEVICE", "gpu");
    cmd
}

/// Runs `emberlm chat` with `input` on stdin; (exit code, stdout, stderr).
fn chat(args: &[&str], input: &str) -> (i32, String, String) {
    let mut child = emberlm()
        .arg("chat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let mut stdin = child.stdin.take().expect("stdin is piped");
    // The program may exit before reading everything (after /quit): ignore a broken pipe.
    let _ = stdin.write_all(input.as_bytes());
    drop(stdin);
    let out = child.wait_with_output().expect("the binary finishes");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Stdout split into blocks: runs of command answers (`# ` lines) and runs of reply lines.
fn blocks(out: &str) -> Vec<(bool, String)> {
    let mut blocks: Vec<(bool, String)> = Vec::new();
    for line in out.lines() {
        let answer = line.starts_with("# ");
        match blocks.last_mut() {
            Some((kind, text)) if *kind == answer => {
                text.push('\n');
                text.push_str(line);
            }
            _ => blocks.push((answer, line.to_string())),
        }
    }
    blocks
}

fn replies(out: &str) -> Vec<String> {
    blocks(out)
        .into_iter()
        .filter(|(answer, _)| !answer)
        .map(|(_, text)| text)
        .collect()
}

/// The value `/settings` printed last for `name`.
fn setting(out: &str, name: &str) -> Option<String> {
    let prefix = format!("# {name} = ");
    out.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .next_back()
        .map(str::to_string)
}

fn stats_lines(err: &str) -> usize {
    err.lines()
        .filter(|l| l.starts_with('[') && l.contains("tok/s"))
        .count()
}

#[test]
fn chat_commands_history_and_reset() {
    for model in [LLAMA, GPT2] {
        // `/max_tokens` without a value only shows it: it separates two replies in stdout.
        let input = "/temp 0\n/max_tokens 8\n/settings\n/top_p 7\n/settings\n/frobnicate\n\
                     hello there\n/max_tokens\nhow are you\n/settings\n/reset\n/settings\n\
                     hello there\n/quit\nnever read\n";
        let (code, out, err) = chat(&["--model", model], input);
        if require::cli_found_no_gpu(&err) {
            return;
        }
        assert_eq!(code, 0, "{model}: {err}");
        assert!(out.starts_with("# temperature = 0\n"), "{model}: {out}");
        assert!(out.contains("# max_new_tokens = 8\n"), "{model}: {out}");
        // The rejected value is named and the old one stays.
        assert!(err.contains("top_p"), "{model}: {err}");
        assert!(err.contains("(0, 1]"), "{model}: {err}");
        let settings: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("# top_p = "))
            .collect();
        assert_eq!(settings, ["# top_p = 0.9"; 4], "{model}: {out}");
        assert!(
            err.contains("unknown command `/frobnicate`") && err.contains("/help"),
            "{model}: {err}"
        );
        // Three replies, each followed by a stats line; /quit stops reading.
        assert_eq!(stats_lines(&err), 3, "{model}: {err}");
        let r = replies(&out);
        assert_eq!(r.len(), 3, "{model}: {out}");
        assert_eq!(r[0], r[2], "{model}: after /reset the first reply repeats");
        assert!(
            out.contains("# history = 4 messages\n# conversation cleared"),
            "{model}: {out}"
        );
        assert_eq!(setting(&out, "history").as_deref(), Some("0 messages"));
        assert_eq!(setting(&out, "temperature").as_deref(), Some("0"));
        assert!(!out.contains("never read"));
        // The second turn sees the first: its prompt reused the cached conversation.
        let cached: Vec<&str> = err.lines().filter(|l| l.contains(" cached")).collect();
        assert!(cached[1].contains("prompt") && !cached[1].contains("(0 cached)"));
        assert!(cached[2].contains("(0 cached)"), "{model}: {err}");
    }
}

#[test]
fn chat_ends_at_eof_quit_and_exit() {
    for (input, replies_expected) in [
        ("/temp 0\n/max_tokens 3\nhi\n", 1),
        // `//` escapes a leading slash; a trailing `\` continues the message.
        ("/max_tokens 2\n//settings\nfirst \\\nsecond\n", 2),
        ("/max_tokens 3\nquit\nhi\n", 0),
        ("exit\n", 0),
        ("", 0),
    ] {
        let (code, out, err) = chat(&["--model", LLAMA], input);
        if require::cli_found_no_gpu(&err) {
            return;
        }
        assert_eq!(code, 0, "{input:?}: {err}");
        assert_eq!(stats_lines(&err), replies_expected, "{input:?}: {out}");
    }
}

#[test]
fn chat_flags_set_the_starting_values() {
    let (code, out, err) = chat(
        &[
            "--model",
            LLAMA,
            "--temperature",
            "0.5",
            "--top-k",
            "7",
            "--seed",
            "9",
            "--system",
            "Be brief.",
        ],
        "/settings\n/system\n/seed random\n/seed\n/rep_pen 1.1\n/rep_pen 0\n/top_k x\n/help\n",
    );
    if require::cli_found_no_gpu(&err) {
        return;
    }
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("# temperature = 0.5\n"), "{out}");
    assert!(out.contains("# top_k = 7\n"), "{out}");
    assert!(out.contains("# seed = 9\n"), "{out}");
    assert!(out.contains("# system = \"Be brief.\"\n"), "{out}");
    assert!(out.contains("# system = (none)\n"), "{out}");
    assert!(out.contains("# seed = random\n# seed = random\n"), "{out}");
    assert!(out.contains("# repetition_penalty = 1.1\n"), "{out}");
    assert!(err.contains("repetition_penalty"), "{err}");
    assert!(err.contains("top_k"), "{err}");
    assert!(
        out.contains("#   /reset"),
        "/help lists the commands: {out}"
    );
}

#[test]
fn chat_usage_errors_exit_2() {
    let (code, _, err) = chat(&["--model", LLAMA, "--top-p", "2"], "");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("top_p"), "{err}");
    let (code, _, err) = chat(&["--model", LLAMA, "--no-such-flag"], "");
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = chat(&["--model", LLAMA, "--num-return-sequences", "2"], "");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--num-return-sequences"), "{err}");
    let (code, _, err) = chat(&["--model", "tests/fixtures/missing.gguf"], "");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("missing.gguf"), "{err}");
}

#[cfg(unix)]
fn interrupt(pid: u32) {
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

/// Reads from `r` until `pred` holds for what was read (or the stream ends).
#[cfg(unix)]
fn read_until(r: &mut impl Read, seen: &mut String, pred: impl Fn(&str) -> bool) {
    let mut buf = [0u8; 256];
    while !pred(seen) {
        match r.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
        }
    }
}

#[cfg(unix)]
#[test]
fn ctrl_c_stops_the_reply_not_the_program() {
    let mut child = emberlm()
        .args(["chat", "--model", LLAMA, "--temperature", "0"])
        // Token 0 ends a turn: forbid it so the reply runs until stopped.
        .args(["--logit-bias", "0=-100", "--max-new-tokens", "100000"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let mut stdin = child.stdin.take().expect("piped");
    let mut stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let mut stderr = stderr;
        let _ = stderr.read_to_string(&mut s);
        s
    });
    stdin
        .write_all(b"/settings\ntell me everything\n")
        .expect("write");
    stdin.flush().expect("flush");
    let mut seen = String::new();
    // The settings, then some reply text.
    read_until(&mut stdout, &mut seen, |s| {
        s.find("# history = 0 messages\n")
            .is_some_and(|i| s.len() > i + 40)
    });
    interrupt(child.id());
    stdin.write_all(b"/settings\n/quit\n").expect("write");
    drop(stdin);
    let mut rest = String::new();
    let _ = stdout.read_to_string(&mut rest);
    seen.push_str(&rest);
    let status = child.wait().expect("finishes");
    let err = err_reader.join().unwrap_or_default();
    if require::cli_found_no_gpu(&err) {
        return;
    }
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.contains(", stopped]"), "{err}");
    assert_eq!(setting(&seen, "history").as_deref(), Some("2 messages"));
}

#[cfg(unix)]
#[test]
fn ctrl_c_at_the_prompt_exits() {
    let mut child = emberlm()
        .args(["chat", "--model", LLAMA])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let mut stderr = child.stderr.take().expect("piped");
    // Kept open until the end: `wait` would close it, and end of input also ends the chat.
    let stdin = child.stdin.take();
    let mut seen = String::new();
    // The banner comes once the handler is in place.
    read_until(&mut stderr, &mut seen, |s| s.contains("/help"));
    if require::cli_found_no_gpu(&seen) {
        let _ = child.wait();
        return;
    }
    interrupt(child.id());
    let status = child.wait().expect("finishes");
    drop(stdin);
    assert_eq!(status.code(), Some(130), "{seen}");
}

/// A bare `help` or `?` lists the commands instead of going to the model, and the welcome line
/// names the model, its size, the context and the sampling settings.
#[test]
fn bare_help_lists_the_commands_and_the_banner_describes_the_session() {
    let (code, out, err) = chat(
        &["--model", LLAMA, "--temperature", "0.7", "--top-k", "9"],
        "help\n?\n",
    );
    if require::cli_found_no_gpu(&err) {
        return;
    }
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.matches("#   /reset").count(), 2, "{out}");
    assert!(replies(&out).is_empty(), "nothing went to the model: {out}");
    assert_eq!(stats_lines(&err), 0, "{err}");
    let banner = err
        .lines()
        .find(|l| l.starts_with("emberlm chat:"))
        .unwrap_or("");
    for part in [
        "tiny-llama-q4_1.gguf",
        "parameters",
        "context",
        "temperature 0.7, top-k 9, top-p 0.9",
    ] {
        assert!(banner.contains(part), "{part}: {banner}");
    }
}

/// `--no-template`: a line is continued as plain text (the reply is what `generate` gives for
/// the same text), and the next line is appended to the running text after a newline.
#[test]
fn no_template_continues_plain_text() {
    let settings = ["--temperature", "0", "--max-new-tokens", "6"];
    let mut args = vec!["--model", LLAMA, "--no-template"];
    args.extend_from_slice(&settings);
    let (code, out, err) = chat(&args, "Once upon a time\nThe end\n");
    if require::cli_found_no_gpu(&err) {
        return;
    }
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("plain completion"), "{err}");
    let generate = |prompt: &str| {
        let mut cmd = emberlm();
        cmd.args(["generate", "--model", LLAMA, "--json", "--prompt", prompt]);
        cmd.args(settings);
        let out = cmd.output().expect("the binary runs");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["sequences"][0]["text"].as_str().unwrap().to_string()
    };
    // each reply is streamed, then a newline
    let first = generate("Once upon a time");
    let second = generate(&format!("Once upon a time{first}\nThe end"));
    assert_eq!(out, format!("{first}\n{second}\n"));
}

/// `/save` writes the conversation; `/load` in a later run continues it from its KV cache
/// (the reply equals the one the first run gave, and its prompt reuses the restored
/// positions); a missing or foreign file is an error and the conversation goes on.
#[test]
fn chat_save_and_load_continue_a_conversation() {
    let dir = std::env::temp_dir().join(format!("emberlm-chat-save-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("talk.kv");
    let file = file.to_str().unwrap();
    let first = format!(
        "/temp 0\n/max_tokens 6\n/system be brief\nhello there\n/save {file}\nhow are you\n/quit\n"
    );
    let (code, out, err) = chat(&["--model", LLAMA, "--device", "cpu"], &first);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("# saved 2 messages (") && out.contains(file),
        "{out}"
    );
    let before = replies(&out);
    assert_eq!(before.len(), 2, "{out}");

    let second = format!(
        "/temp 0\n/max_tokens 6\n/load {dir}/missing.kv\n/load {file}\n/settings\nhow are you\n/quit\n",
        dir = dir.display()
    );
    let (code, out, err) = chat(&["--model", LLAMA, "--device", "cpu"], &second);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("missing.kv") && err.contains("stays as it was"),
        "{err}"
    );
    assert!(out.contains("# loaded 2 messages ("), "{out}");
    assert_eq!(
        setting(&out, "history").as_deref(),
        Some("2 messages"),
        "{out}"
    );
    assert!(out.contains("# system = \"be brief\""), "{out}");
    let after = replies(&out);
    assert_eq!(after, [before[1].clone()], "{out}");
    let cached: Vec<&str> = err.lines().filter(|l| l.contains(" cached")).collect();
    assert!(!cached[0].contains("(0 cached)"), "{err}");

    // another model's file is refused, and that session's conversation goes on
    let third = format!("/temp 0\n/max_tokens 4\n/load {file}\nhello\n/quit\n");
    let (code, out, err) = chat(&["--model", GPT2, "--device", "cpu"], &third);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("another model"), "{err}");
    assert_eq!(replies(&out).len(), 1, "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
