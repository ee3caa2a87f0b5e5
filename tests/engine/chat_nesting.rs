#![cfg(not(target_arch = "wasm32"))]
//! The nesting limits checked before a chat template is compiled: every way a template can build
//! a deep syntax tree is refused by name past its limit, a template at every limit at once
//! compiles and renders on a 1 MiB stack (a WebAssembly module's default) in this unoptimized
//! build, and deep-looking text that is not nesting (dashes in text, long flat lists, `set`
//! assignments) is not refused.

use emberlm::chat::{ChatMessage, ChatTemplate, MAX_BLOCKS, MAX_BRACKETS, MAX_OPERATORS};

fn messages() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hello"),
    ]
}

/// Compiles and renders `source` on a thread with a 1 MiB stack.
fn render_on_small_stack(source: String) -> emberlm::Result<String> {
    std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || ChatTemplate::new(&source, "<s>", "</s>")?.render(&messages(), true))
        .expect("a thread")
        .join()
        .expect("no panic")
}

fn refused(source: &str) -> String {
    match ChatTemplate::new(source, "<s>", "</s>") {
        Ok(_) => panic!("compiled: {}", &source[..source.len().min(80)]),
        Err(e) => e.to_string(),
    }
}

/// Each chain below overflowed a 1 MiB stack (several also a 2 MiB one) before the limits, at
/// the length given; the one that the fuzzer found was the chain of minus signs.
#[test]
fn every_kind_of_deep_nesting_is_refused_by_name() {
    let deep = [
        ("minus signs", format!("{{{{ {}1 }}}}", "-".repeat(3000))),
        ("not", format!("{{{{ {}x }}}}", "not ".repeat(3000))),
        ("additions", format!("{{{{ 1{} }}}}", "+1".repeat(3000))),
        ("attributes", format!("{{{{ a{} }}}}", ".b".repeat(1000))),
        ("filters", format!("{{{{ 1{} }}}}", "|abs".repeat(1000))),
        (
            "conditionals",
            format!("{{{{ 1{} }}}}", " if a else 1".repeat(1000)),
        ),
        (
            "parentheses",
            format!("{{{{ {}1{} }}}}", "(".repeat(100), ")".repeat(100)),
        ),
        (
            "lists",
            format!("{{{{ {}1{} }}}}", "[".repeat(100), "]".repeat(100)),
        ),
        (
            "ifs",
            format!("{}x{}", "{% if a %}".repeat(150), "{% endif %}".repeat(150)),
        ),
        (
            "loops",
            format!(
                "{}x{}",
                "{% for i in [1] %}".repeat(150),
                "{% endfor %}".repeat(150)
            ),
        ),
        (
            "set blocks",
            format!(
                "{}x{}",
                "{% set v %}".repeat(150),
                "{% endset %}".repeat(150)
            ),
        ),
    ];
    for (what, source) in deep {
        let err = refused(&source);
        assert!(err.contains("nests too deeply"), "{what}: {err}");
        assert!(err.contains("the limit is"), "{what}: {err}");
        assert!(err.contains("line 1"), "{what}: {err}");
    }
    // One past each limit is refused; at the limit is not (checked on a small stack below).
    let err = refused(&format!(
        "{{{{ {}1{} }}}}",
        "(".repeat(MAX_BRACKETS + 1),
        ")".repeat(MAX_BRACKETS + 1)
    ));
    assert!(
        err.contains(&format!("{} brackets deep", MAX_BRACKETS + 1)),
        "{err}"
    );
    let err = refused(&format!(
        "{}x{}",
        "{% if a %}".repeat(MAX_BLOCKS + 1),
        "{% endif %}".repeat(MAX_BLOCKS + 1)
    ));
    assert!(
        err.contains(&format!("{} block statements", MAX_BLOCKS + 1)),
        "{err}"
    );
    let err = refused(&format!("{{{{ {}1 }}}}", "-".repeat(MAX_OPERATORS + 1)));
    assert!(
        err.contains(&format!("the limit is {MAX_OPERATORS}")),
        "{err}"
    );
    // Blocks closed before the next opens do not add up.
    let flat = "{% if a %}x{% endif %}".repeat(MAX_BLOCKS * 4);
    ChatTemplate::new(&flat, "<s>", "</s>").expect("flat blocks");
}

/// The deepest template the limits allow, in the shapes that cost the most stack per level, in
/// every tag of the innermost block: it compiles, renders and is freed on a 1 MiB stack.
#[test]
fn a_template_at_every_limit_renders_on_a_1_mib_stack() {
    let operators = MAX_OPERATORS - MAX_BRACKETS;
    let chains = [
        format!("a{}", ".b".repeat(operators)),
        format!("1{}", "|abs".repeat(operators)),
        format!("1{}", " if a else 1".repeat(operators / 2)),
        format!("{}1", "-".repeat(operators)),
    ];
    for chain in chains {
        let open = (0..MAX_BLOCKS)
            .map(|i| {
                if i % 2 == 0 {
                    "{% for i in [1] %}"
                } else {
                    "{% if true %}"
                }
            })
            .collect::<String>();
        let close = (0..MAX_BLOCKS)
            .rev()
            .map(|i| {
                if i % 2 == 0 {
                    "{% endfor %}"
                } else {
                    "{% endif %}"
                }
            })
            .collect::<String>();
        let expr = format!(
            "{}{chain}{}",
            "(".repeat(MAX_BRACKETS),
            ")".repeat(MAX_BRACKETS)
        );
        let source = format!("{open}{{{{ {expr} }}}}{{% set z = {expr} %}}[{{{{ z }}}}]{close}");
        match render_on_small_stack(source) {
            Ok(text) => assert!(text.starts_with('[') || !text.is_empty(), "{text}"),
            // An attribute of an undefined value, or the like, is a render error, not a crash.
            Err(e) => assert!(!e.to_string().contains("nests too deeply"), "{e}"),
        }
    }
}

/// Text that only looks deep is not refused: dashes and brackets outside tags, long flat lists
/// and dicts, many `set` assignments, and many short tags.
#[test]
fn flat_templates_that_look_deep_are_allowed() {
    let text = format!(
        "{}{}{}",
        "-".repeat(5000),
        "(".repeat(500),
        "{ [ ".repeat(500)
    );
    let list = (0..2000)
        .map(|i| format!("'r{i}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let dict = (0..500)
        .map(|i| format!("'k{i}': {i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let sets = "{% set x = 1 %}".repeat(500);
    let tags = "{{ -1 - -1 }}".repeat(2000);
    let source = format!(
        "{text}{{% set roles = [{list}] %}}{{% set d = {{{dict}}} %}}{sets}{tags}{{{{ roles|length }}}} {{{{ d|length }}}}"
    );
    let out = render_on_small_stack(source).expect("renders");
    assert!(out.starts_with(&text), "text outside tags kept");
    assert!(out.ends_with("2000 500"), "{}", &out[out.len() - 20..]);
}
