//! The head of an HTTP/1.1 request as `emberlm serve-api` reads it: the request line and headers
//! parsed by `httparse` from the bytes received so far, with the method, the path (without its
//! query), the declared body length and whether the body is chunked. Pure, so that it can be
//! fuzzed; the server feeds it what it has read until the head is complete, invalid or larger
//! than [`HEAD_LIMIT`].

use super::access::AccessHeaders;

/// Largest request head (request line and headers) accepted, in bytes.
pub const HEAD_LIMIT: usize = 16 << 10;
/// Headers parsed at most (more is an invalid head).
pub const MAX_HEADERS: usize = 64;

/// A complete request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// `GET`, `POST`, …
    pub method: String,
    /// The request target without its query (`/v1/completions`).
    pub path: String,
    /// The declared body length.
    pub content_length: Option<usize>,
    /// Whether a `Transfer-Encoding` was declared (the body is chunked).
    pub chunked: bool,
    /// Whether the client keeps the connection for another request: HTTP/1.1 unless it sent
    /// `Connection: close`, HTTP/1.0 only with `Connection: keep-alive`.
    pub keep_alive: bool,
    /// `Host`, `Origin`, `Authorization` and whether it is a CORS preflight: what
    /// [`super::access::AccessPolicy::check`] decides on.
    pub access: AccessHeaders,
    /// Bytes the head takes, its empty line included: the body starts there.
    pub len: usize,
}

/// What the bytes received so far hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadParse {
    /// Not a whole head yet (and still under [`HEAD_LIMIT`]).
    Partial,
    /// A whole head.
    Complete(RequestHead),
    /// Not a request the server takes: the status to answer with and why.
    Invalid(u16, String),
}

/// Parses the head at the start of `buf`.
pub fn parse_head(buf: &[u8]) -> HeadParse {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    let len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= HEAD_LIMIT => {
            return HeadParse::Invalid(
                431,
                format!("the request head is larger than {HEAD_LIMIT} bytes"),
            )
        }
        Ok(httparse::Status::Partial) => return HeadParse::Partial,
        Err(e) => return HeadParse::Invalid(400, format!("not an HTTP/1.1 request: {e}")),
    };
    if len > HEAD_LIMIT {
        return HeadParse::Invalid(
            431,
            format!("the request head is larger than {HEAD_LIMIT} bytes"),
        );
    }
    let method = parsed.method.unwrap_or("").to_string();
    let target = parsed.path.unwrap_or("");
    let path = target.split('?').next().unwrap_or("").to_string();
    let mut content_length = None;
    let mut chunked = false;
    let mut access = AccessHeaders::default();
    let (mut close, mut keep) = (false, false);
    for h in parsed.headers.iter() {
        if h.name.eq_ignore_ascii_case("connection") {
            for option in String::from_utf8_lossy(h.value).split(',') {
                close |= option.trim().eq_ignore_ascii_case("close");
                keep |= option.trim().eq_ignore_ascii_case("keep-alive");
            }
        }
        let text = || String::from_utf8_lossy(h.value).trim().to_string();
        // one of each: two would leave which one counts to whoever reads them
        let once = |slot: &mut Option<String>, name: &str| match slot {
            Some(_) => Err(format!("two {name} headers")),
            None => {
                *slot = Some(text());
                Ok(())
            }
        };
        let seen = if h.name.eq_ignore_ascii_case("host") {
            once(&mut access.host, "Host")
        } else if h.name.eq_ignore_ascii_case("origin") {
            once(&mut access.origin, "Origin")
        } else if h.name.eq_ignore_ascii_case("authorization") {
            once(&mut access.authorization, "Authorization")
        } else {
            if h.name.eq_ignore_ascii_case("access-control-request-method") {
                access.preflight = true;
            }
            Ok(())
        };
        if let Err(why) = seen {
            return HeadParse::Invalid(400, why);
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            let value = String::from_utf8_lossy(h.value);
            let value = value.trim();
            let Ok(n) = value.parse::<usize>() else {
                return HeadParse::Invalid(
                    400,
                    format!("Content-Length {value:?} is not a number"),
                );
            };
            if content_length.is_some_and(|m| m != n) {
                return HeadParse::Invalid(400, "two different Content-Length headers".into());
            }
            content_length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = true;
        }
    }
    HeadParse::Complete(RequestHead {
        method,
        path,
        content_length,
        chunked,
        keep_alive: !close && (parsed.version == Some(1) || keep),
        access,
        len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_parse_and_bad_ones_name_the_problem() {
        let text = b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\ncontent-length: 12\r\n\r\n{\"prompt\":1}";
        let HeadParse::Complete(h) = parse_head(text) else {
            panic!("{:?}", parse_head(text));
        };
        assert_eq!(
            (h.method.as_str(), h.path.as_str()),
            ("POST", "/v1/completions")
        );
        assert_eq!((h.content_length, h.chunked), (Some(12), false));
        assert_eq!(h.access.host.as_deref(), Some("a"));
        assert!(h.keep_alive, "HTTP/1.1 keeps the connection by default");
        let keeps = |t: &[u8]| match parse_head(t) {
            HeadParse::Complete(h) => h.keep_alive,
            other => panic!("{other:?}"),
        };
        assert!(!keeps(b"GET / HTTP/1.1\r\nConnection: Close\r\n\r\n"));
        assert!(!keeps(b"GET / HTTP/1.0\r\n\r\n"));
        assert!(keeps(
            b"GET / HTTP/1.0\r\nConnection: TE, keep-alive\r\n\r\n"
        ));
        assert_eq!(
            (h.access.origin.as_deref(), h.access.preflight),
            (None, false)
        );
        let text2 = b"OPTIONS / HTTP/1.1\r\nHost: a\r\nOrigin: https://b\r\nAccess-Control-Request-Method: POST\r\nAuthorization:  Bearer k \r\n\r\n";
        let HeadParse::Complete(h2) = parse_head(text2) else {
            panic!("{:?}", parse_head(text2));
        };
        assert_eq!(h2.access.origin.as_deref(), Some("https://b"));
        assert_eq!(h2.access.authorization.as_deref(), Some("Bearer k"));
        assert!(h2.access.preflight);
        assert_eq!(&text[h.len..], b"{\"prompt\":1}");
        for cut in 0..h.len {
            assert_eq!(parse_head(&text[..cut]), HeadParse::Partial, "cut {cut}");
        }
        let bad = |t: &[u8]| match parse_head(t) {
            HeadParse::Invalid(status, why) => (status, why),
            other => panic!("{other:?}"),
        };
        assert_eq!(bad(b"HELLO\r\n\r\n").0, 400);
        assert!(bad(b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n")
            .1
            .contains("not a number"));
        assert!(
            bad(b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n")
                .1
                .contains("two different")
        );
        assert!(bad(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
            .1
            .contains("two Host headers"));
        let long = format!("GET / HTTP/1.1\r\nX: {}\r\n", "a".repeat(HEAD_LIMIT));
        assert_eq!(bad(long.as_bytes()).0, 431);
    }
}
