//! Stop strings in streamed text.

/// Finds stop strings in streamed text across piece boundaries. Text that could still be the
/// start of a stop string is held back; when a stop string is found, neither it nor anything
/// after it is emitted.
///
/// Generation stops as soon as any stop string is complete; when several are complete at once,
/// the one that starts first wins. Empty stop strings are ignored. Text is only ever split at
/// character boundaries.
#[derive(Clone, Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet emitted: the longest tail that is a prefix of a stop string.
    pending: String,
    stopped: bool,
}

/// What [`StopMatcher::push`] releases.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StopOutput {
    /// Text safe to emit now.
    pub text: String,
    /// True once a stop string matched.
    pub stopped: bool,
}

/// Length in bytes of the longest tail of `text` that is a proper prefix of `stop`.
fn partial_tail(text: &str, stop: &str) -> usize {
    let (text, stop) = (text.as_bytes(), stop.as_bytes());
    let Some(&first) = stop.first() else {
        return 0;
    };
    let start = text.len().saturating_sub(stop.len().saturating_sub(1));
    (start..text.len())
        .find(|&i| text[i] == first && stop.starts_with(&text[i..]))
        .map_or(0, |i| text.len() - i)
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
            stopped: false,
        }
    }

    /// Feeds the next decoded piece.
    pub fn push(&mut self, piece: &str) -> StopOutput {
        if self.stopped {
            return StopOutput {
                text: String::new(),
                stopped: true,
            };
        }
        self.pending.push_str(piece);
        // Every match starts inside `pending`: earlier text could not begin a stop string.
        let first_match = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = first_match {
            self.pending.truncate(at);
            self.stopped = true;
            return StopOutput {
                text: std::mem::take(&mut self.pending),
                stopped: true,
            };
        }
        let held = self
            .stops
            .iter()
            .map(|s| partial_tail(&self.pending, s))
            .max()
            .unwrap_or(0);
        // A held tail starts with the first byte of a stop string, so on a character boundary;
        // stepping back is only a safeguard.
        let mut split = self.pending.len() - held;
        while !self.pending.is_char_boundary(split) {
            split -= 1;
        }
        let rest = self.pending.split_off(split);
        StopOutput {
            text: std::mem::replace(&mut self.pending, rest),
            stopped: false,
        }
    }

    /// End of generation: releases the held-back text (empty if stopped).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// True once a stop string matched.
    pub fn stopped(&self) -> bool {
        self.stopped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_tail_finds_the_longest_prefix() {
        assert_eq!(partial_tail("xxab", "abc"), 2);
        assert_eq!(partial_tail("xxa", "abc"), 1);
        assert_eq!(partial_tail("xx", "abc"), 0);
        assert_eq!(partial_tail("aaa", "aab"), 2);
        assert_eq!(partial_tail("", "abc"), 0);
        assert_eq!(
            partial_tail("abc", "abc"),
            0,
            "a complete match is not partial"
        );
        assert_eq!(partial_tail("é", "\u{e9}x"), 2);
    }
}
