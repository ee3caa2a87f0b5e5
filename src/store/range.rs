//! Resuming a download with an HTTP `Range` request: what the server's answer means for the
//! bytes already kept.

/// A `Content-Range: bytes FIRST-LAST/TOTAL` header (`TOTAL` may be `*`, unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentRange {
    /// The first byte sent.
    pub first: u64,
    /// The last byte sent (inclusive).
    pub last: u64,
    /// The file's length, when the server says.
    pub total: Option<u64>,
}

/// Parses a `Content-Range` header of a `206` response; `None` when it is not one (an
/// unsatisfied range's `bytes */TOTAL`, other units, several ranges, an empty or reversed span).
pub fn parse_content_range(value: &str) -> Option<ContentRange> {
    let rest = value.trim().strip_prefix("bytes")?;
    let rest = rest
        .strip_prefix(|c: char| c == ' ' || c == '\t')?
        .trim_start();
    let (span, total) = rest.split_once('/')?;
    let (first, last) = span.trim().split_once('-')?;
    let number = |s: &str| -> Option<u64> {
        let s = s.trim();
        if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    let first = number(first)?;
    let last = number(last)?;
    if last < first {
        return None;
    }
    let total = match total.trim() {
        "*" => None,
        t => {
            let t = number(t)?;
            if last >= t {
                return None;
            }
            Some(t)
        }
    };
    Some(ContentRange { first, last, total })
}

/// What to do with the answer to a request for the bytes from `asked_from` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    /// The body is the rest of the file, from `asked_from`: append it to what is kept.
    Continue,
    /// The body is the whole file (the server ignored the range): drop what is kept and read
    /// the body from its start.
    FromStart,
    /// The body cannot be used (another span, another file, a range the server could not
    /// check): drop what is kept and ask again for the whole file. The reason says why.
    Refetch(String),
    /// Neither success nor a range answer: the request failed with this status.
    Failed(u16),
}

/// Decides from a response to `Range: bytes=ASKED_FROM-`: its `status`, its `Content-Range`
/// (`None` when absent or not exposed to the page across origins), its `Content-Length` (0 when
/// unknown) and the file's length as first announced (`expected_total`, 0 when unknown).
pub fn resume(
    asked_from: u64,
    status: u16,
    content_range: Option<&str>,
    content_length: u64,
    expected_total: u64,
) -> Resume {
    match status {
        200 => return Resume::FromStart,
        206 => {}
        416 => {
            return Resume::Refetch(format!(
                "the server cannot send the bytes from {asked_from} on (416)"
            ))
        }
        s => return Resume::Failed(s),
    }
    let Some(header) = content_range else {
        // Without a readable Content-Range, a body of exactly the missing length is the rest.
        if expected_total > 0 && asked_from.checked_add(content_length) == Some(expected_total) {
            return Resume::Continue;
        }
        return Resume::Refetch(
            "the server's Content-Range is not readable here (it must be listed in \
             Access-Control-Expose-Headers across origins)"
                .to_string(),
        );
    };
    let Some(range) = parse_content_range(header) else {
        return Resume::Refetch(format!("an unreadable Content-Range `{header}`"));
    };
    if range.first != asked_from {
        return Resume::Refetch(format!(
            "asked for the bytes from {asked_from}, the server sent them from {}",
            range.first
        ));
    }
    match range.total {
        Some(total) if expected_total > 0 && total != expected_total => Resume::Refetch(format!(
            "the file is now {total} bytes, it was {expected_total}: it changed"
        )),
        Some(total) if range.last.checked_add(1) != Some(total) => Resume::Refetch(format!(
            "the server sent the bytes up to {} of {total}, not the rest of the file",
            range.last
        )),
        _ => Resume::Continue,
    }
}
