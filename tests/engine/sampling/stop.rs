//! Stop strings in streamed text: matches split across pieces, released partial matches,
//! multibyte pieces and agreement with a search of the whole text.

use emberlm::sampling::{StopMatcher, StopOutput};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

fn stops(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn out(text: &str, stopped: bool) -> StopOutput {
    StopOutput {
        text: text.to_string(),
        stopped,
    }
}

#[test]
fn stop_split_across_two_pieces() {
    let mut m = StopMatcher::new(&stops(&["</s>"]));
    assert_eq!(m.push("Hello </"), out("Hello ", false));
    assert_eq!(m.push("s> world"), out("", true));
    assert!(m.stopped());
    assert_eq!(m.push("more"), out("", true));
    assert_eq!(m.finish(), "");
}

#[test]
fn stop_split_across_three_pieces() {
    let mut m = StopMatcher::new(&stops(&["STOP"]));
    assert_eq!(m.push("aS"), out("a", false));
    assert_eq!(m.push("T"), out("", false));
    assert_eq!(m.push("OPb"), out("", true));
    assert_eq!(m.finish(), "");
}

#[test]
fn partial_match_is_released_when_it_breaks() {
    let mut m = StopMatcher::new(&stops(&["</s>"]));
    assert_eq!(m.push("a</"), out("a", false));
    assert_eq!(m.push("b"), out("</b", false));
    // A partial that restarts inside itself: "<</s" holds "</s" only.
    assert_eq!(m.push("<</s"), out("<", false));
    assert_eq!(m.push("!"), out("</s!", false));
    assert!(!m.stopped());
    assert_eq!(m.finish(), "");
}

#[test]
fn stop_at_the_very_start() {
    let mut m = StopMatcher::new(&stops(&["</s>"]));
    assert_eq!(m.push("</s>hello"), out("", true));
    assert_eq!(m.finish(), "");
    let mut m = StopMatcher::new(&stops(&["x"]));
    assert_eq!(m.push("x"), out("", true));
}

#[test]
fn multiple_stop_strings() {
    let mut m = StopMatcher::new(&stops(&["\n\n", "User:"]));
    assert_eq!(m.push("Hi"), out("Hi", false));
    assert_eq!(m.push(" there"), out(" there", false));
    // "\nUs" could start "User:" at "Us" (and "\n" cannot start "\n\n" followed by "U").
    assert_eq!(m.push("\nUs"), out("\n", false));
    assert_eq!(m.push("er: more"), out("", true));

    // Both complete in one piece: the one that starts first wins.
    let mut m = StopMatcher::new(&stops(&["b", "abc"]));
    assert_eq!(m.push("xabcd"), out("x", true));
    // Held back for the longer of two partial matches.
    let mut m = StopMatcher::new(&stops(&["cd", "bcde"]));
    assert_eq!(m.push("abc"), out("a", false));
    assert_eq!(m.push("x"), out("bcx", false));
}

#[test]
fn multibyte_pieces_are_never_split() {
    let mut m = StopMatcher::new(&stops(&["😀!"]));
    assert_eq!(m.push("hi 😀"), out("hi ", false));
    assert_eq!(m.push("?"), out("😀?", false));
    assert_eq!(m.push(" 😀"), out(" ", false));
    assert_eq!(m.push("!"), out("", true));

    // 😁 shares its first three bytes with 😀: not a partial match.
    let mut m = StopMatcher::new(&stops(&["😀😀"]));
    assert_eq!(m.push("a😁"), out("a😁", false));
    assert_eq!(m.push("x😀"), out("x", false));
    assert_eq!(m.push("😁"), out("😀😁", false));
    assert_eq!(m.push("é😀"), out("é", false));
    assert_eq!(m.push("😀"), out("", true));

    // A stop string that starts with a multibyte character inside a longer piece.
    let mut m = StopMatcher::new(&stops(&["éé"]));
    assert_eq!(m.push("caféé au lait"), out("caf", true));
}

#[test]
fn finish_releases_held_text() {
    let mut m = StopMatcher::new(&stops(&["END"]));
    assert_eq!(m.push("the EN"), out("the ", false));
    assert_eq!(m.finish(), "EN");
    assert!(!m.stopped());

    let mut none = StopMatcher::new(&[]);
    assert_eq!(none.push("anything </s>"), out("anything </s>", false));
    assert_eq!(none.finish(), "");
}

/// Streams `text` split at random char boundaries and compares with matching the whole text at
/// once. With stop strings none of which contains another, the first stop string to complete
/// is the one that ends first, wherever the pieces are split.
#[test]
fn stop_matcher_matches_a_whole_text_search() {
    const SEED: u64 = 0x6EED_0007;
    let mut rng = ChaCha20Rng::seed_from_u64(SEED);
    let alphabet = ['a', 'b', 'c', 'é', '😀', '\n'];
    let stop_sets = [
        stops(&["ab"]),
        stops(&["abc", "ca"]),
        stops(&["😀a", "é\n"]),
        stops(&["aab", "bb", "c😀é"]),
        stops(&["\n\n", "éé"]),
    ];
    for round in 0..3000 {
        let set = &stop_sets[round % stop_sets.len()];
        let len = rng.random_range(0..30);
        let text: String = (0..len)
            .map(|_| alphabet[rng.random_range(0..alphabet.len())])
            .collect();
        // Expected: text before the match that ends first.
        let first_end = set
            .iter()
            .filter_map(|s| text.find(s.as_str()).map(|at| (at + s.len(), at)))
            .min();
        let want = first_end.map_or(text.as_str(), |(_, at)| &text[..at]);

        let mut m = StopMatcher::new(set);
        let mut got = String::new();
        let chars: Vec<char> = text.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let n = rng.random_range(1..=4).min(chars.len() - i);
            let piece: String = chars[i..i + n].iter().collect();
            let o = m.push(&piece);
            got.push_str(&o.text);
            assert_eq!(o.stopped, m.stopped());
            i += n;
        }
        got.push_str(&m.finish());
        assert_eq!(
            got, want,
            "seed {SEED:#x} round {round}: text {text:?}, stops {set:?}"
        );
        assert_eq!(
            m.stopped(),
            first_end.is_some(),
            "seed {SEED:#x} round {round}"
        );
    }
}
