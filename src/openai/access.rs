//! Who may use `emberlm serve-api`, decided from a request's head before anything else is read:
//!
//! - **Host.** A request must name the server by an IP address, `localhost`, the address it
//!   listens on or a name given with `--allowed-host`. Any other name is refused with 421: a
//!   web page on a name the attacker controls, re-pointed at 127.0.0.1 (DNS rebinding), would
//!   otherwise be same-origin with the server and read its answers.
//! - **Origin.** A browser names the page a request comes from in `Origin`. Pages not allowed
//!   with `--cors-origin` are refused with 403 before the request runs (a page can send a
//!   `text/plain` POST without a preflight, so refusing only the answer would still let any
//!   site the user visits run completions); allowed ones get CORS answers, preflights included.
//! - **Keys.** With `--api-key` / `--api-key-file`, every request but a CORS preflight needs
//!   `Authorization: Bearer KEY` with one of them (compared in constant time); otherwise 401
//!   in OpenAI's error shape.
//!
//! Pure, so that it is tested and fuzzed with the head parser.

use std::net::IpAddr;

use subtle::ConstantTimeEq;

use crate::{Error, Result};

/// The headers of a request that decide whether it may be served.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessHeaders {
    /// `Host`.
    pub host: Option<String>,
    /// `Origin` (sent by browsers).
    pub origin: Option<String>,
    /// `Authorization`.
    pub authorization: Option<String>,
    /// Whether `Access-Control-Request-Method` was sent (with `OPTIONS`: a CORS preflight).
    pub preflight: bool,
}

/// Which pages may call the server from a browser.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origins {
    /// Every page (`--cors-origin '*'`).
    Any,
    /// These origins (`scheme://host[:port]`, lowercase); none by default.
    Listed(Vec<String>),
}

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Serve it; `cors` is the origin to allow in the answer (a browser request from an
    /// allowed page).
    Allow {
        /// The value of `Access-Control-Allow-Origin`, if any.
        cors: Option<String>,
    },
    /// A CORS preflight from an allowed page: answer 204 with these headers.
    Preflight(Vec<(&'static str, String)>),
    /// Refuse it.
    Refuse(Refusal),
}

/// A refused request: the status, OpenAI's error `type` and `code`, why, and headers to add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// HTTP status (400, 401, 403 or 421).
    pub status: u16,
    /// OpenAI's error `type`.
    pub kind: &'static str,
    /// OpenAI's error `code`, if any.
    pub code: Option<&'static str>,
    /// What was refused and what would be accepted.
    pub message: String,
    /// Headers to add (`WWW-Authenticate`, CORS).
    pub headers: Vec<(&'static str, String)>,
}

/// The server's access settings, checked against every request.
#[derive(Debug, Clone)]
pub struct AccessPolicy {
    keys: Vec<Vec<u8>>,
    listen_host: String,
    hosts: Vec<String>,
    any_host: bool,
    origins: Origins,
}

/// The name of a `Host` value (or of an allowed-host setting): lowercase, without the port and
/// a trailing dot; an IPv6 literal keeps its brackets.
fn host_name(value: &str) -> String {
    let value = value.trim();
    let name = if value.starts_with('[') {
        value.split_inclusive(']').next().unwrap_or(value)
    } else {
        match value.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => value,
        }
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// Whether `name` (as [`host_name`] gives it) is an IP address.
fn is_ip(name: &str) -> bool {
    let bare = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name);
    bare.parse::<IpAddr>().is_ok()
}

/// Checks an origin setting: `*`, or `scheme://host[:port]` with nothing after.
fn origin_setting(value: &str) -> Result<String> {
    let invalid = |why: &str| {
        Error::invalid(
            "cors-origin",
            format!("`{value}` {why}: give an origin such as https://app.example or http://localhost:5173, or *"),
        )
    };
    let (scheme, rest) = value
        .split_once("://")
        .ok_or_else(|| invalid("has no scheme"))?;
    if !matches!(scheme, "http" | "https") {
        return Err(invalid("is not http or https"));
    }
    if rest.is_empty() || rest.contains(['/', '?', '#', ' ']) {
        return Err(invalid("is not just a scheme, a host and a port"));
    }
    Ok(value.to_ascii_lowercase())
}

impl AccessPolicy {
    /// The settings of a server listening on `listen_host`: its API keys (none: no key
    /// needed), the names besides IP addresses and `localhost` that requests may use
    /// (`*`: any), and the pages that may call it from a browser (`*`: any). Empty keys and
    /// malformed origins are errors naming the option.
    pub fn new(
        keys: Vec<String>,
        listen_host: &str,
        allowed_hosts: &[String],
        cors_origins: &[String],
    ) -> Result<Self> {
        let keys = keys
            .into_iter()
            .map(|k| {
                let k = k.trim().to_string();
                match k.is_empty() || k.contains(char::is_whitespace) {
                    true => Err(Error::invalid(
                        "api-key",
                        "an API key must be non-empty and without spaces",
                    )),
                    false => Ok(k.into_bytes()),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let any_host = allowed_hosts.iter().any(|h| h.trim() == "*");
        let hosts = allowed_hosts
            .iter()
            .filter(|h| h.trim() != "*")
            .map(|h| host_name(h))
            .collect();
        let origins = match cors_origins.iter().any(|o| o.trim() == "*") {
            true => Origins::Any,
            false => Origins::Listed(
                cors_origins
                    .iter()
                    .map(|o| origin_setting(o.trim()))
                    .collect::<Result<Vec<_>>>()?,
            ),
        };
        Ok(Self {
            keys,
            listen_host: host_name(listen_host),
            hosts,
            any_host,
            origins,
        })
    }

    /// Whether requests need a key.
    pub fn has_keys(&self) -> bool {
        !self.keys.is_empty()
    }

    fn host_allowed(&self, name: &str) -> bool {
        self.any_host
            || is_ip(name)
            || name == "localhost"
            || name == self.listen_host
            || self.hosts.iter().any(|h| h == name)
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        match &self.origins {
            Origins::Any => true,
            Origins::Listed(list) => list.iter().any(|o| o.eq_ignore_ascii_case(origin)),
        }
    }

    fn key_accepted(&self, authorization: Option<&str>) -> bool {
        let Some(token) = authorization.and_then(|a| {
            let (scheme, token) = a.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        }) else {
            return false;
        };
        // every key compared, in time that does not depend on where a key differs
        let mut accepted = subtle::Choice::from(0);
        for key in &self.keys {
            accepted |= key.as_slice().ct_eq(token.as_bytes());
        }
        bool::from(accepted)
    }

    /// Decides on a request whose method is `method` and whose access headers are `h`;
    /// `public` endpoints (a health check) need no key.
    pub fn check(&self, method: &str, h: &AccessHeaders, public: bool) -> Decision {
        let refuse = |status, kind, code, message: String, headers| {
            Decision::Refuse(Refusal {
                status,
                kind,
                code,
                message,
                headers,
            })
        };
        let Some(host) = &h.host else {
            return refuse(
                400,
                "invalid_request_error",
                None,
                "the request has no Host header (HTTP/1.1 requires one)".into(),
                Vec::new(),
            );
        };
        let name = host_name(host);
        if !self.host_allowed(&name) {
            return refuse(
                421,
                "invalid_request_error",
                None,
                format!(
                    "this server does not answer to the name `{name}`: use an IP address, \
                     localhost, or start it with --allowed-host {name} (other names are refused \
                     so that a web page cannot reach it through DNS rebinding)"
                ),
                Vec::new(),
            );
        }
        let cors = match &h.origin {
            None => None,
            Some(origin) if self.origin_allowed(origin) => Some(origin.clone()),
            Some(origin) => {
                return refuse(
                    403,
                    "invalid_request_error",
                    None,
                    format!(
                        "pages from {origin} may not use this server: start it with \
                         --cors-origin {origin} to allow them"
                    ),
                    Vec::new(),
                )
            }
        };
        let cors_headers = |origin: &Option<String>| match origin {
            Some(o) => vec![
                ("Access-Control-Allow-Origin", o.clone()),
                ("Vary", "Origin".into()),
            ],
            None => Vec::new(),
        };
        if method == "OPTIONS" && h.preflight && cors.is_some() {
            let mut headers = cors_headers(&cors);
            headers.extend([
                ("Access-Control-Allow-Methods", "GET, POST, OPTIONS".into()),
                (
                    "Access-Control-Allow-Headers",
                    "Authorization, Content-Type".into(),
                ),
                ("Access-Control-Max-Age", "600".into()),
            ]);
            return Decision::Preflight(headers);
        }
        if !public && self.has_keys() && !self.key_accepted(h.authorization.as_deref()) {
            let message = match &h.authorization {
                None => {
                    "no API key: send the header `Authorization: Bearer KEY` with a key the \
                         server was given (--api-key or --api-key-file)"
                }
                Some(_) => "the API key is not one this server accepts",
            };
            let mut headers = vec![("WWW-Authenticate", "Bearer".to_string())];
            headers.extend(cors_headers(&cors));
            return refuse(
                401,
                "invalid_request_error",
                Some("invalid_api_key"),
                message.into(),
                headers,
            );
        }
        Decision::Allow { cors }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(host: Option<&str>, origin: Option<&str>, auth: Option<&str>) -> AccessHeaders {
        AccessHeaders {
            host: host.map(Into::into),
            origin: origin.map(Into::into),
            authorization: auth.map(Into::into),
            preflight: false,
        }
    }

    fn status(d: &Decision) -> u16 {
        match d {
            Decision::Allow { .. } => 200,
            Decision::Preflight(_) => 204,
            Decision::Refuse(r) => r.status,
        }
    }

    #[test]
    fn hosts_are_ip_addresses_localhost_the_listen_name_or_allowed_names() {
        let p = AccessPolicy::new(vec![], "box.lan", &["My.Example.".into()], &[]).unwrap();
        for host in [
            "127.0.0.1:8080",
            "10.1.2.3",
            "[::1]:8080",
            "[fe80::1]",
            "localhost:8080",
            "LOCALHOST",
            "box.lan:1",
            "my.example",
            "my.example.:443",
        ] {
            assert_eq!(
                status(&p.check("GET", &head(Some(host), None, None), false)),
                200,
                "{host}"
            );
        }
        for host in [
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.evil",
            "",
            "[::1",
        ] {
            assert_eq!(
                status(&p.check("GET", &head(Some(host), None, None), false)),
                421,
                "{host}"
            );
        }
        assert_eq!(status(&p.check("GET", &head(None, None, None), false)), 400);
        let any = AccessPolicy::new(vec![], "127.0.0.1", &["*".into()], &[]).unwrap();
        assert_eq!(
            status(&any.check("GET", &head(Some("x.y"), None, None), false)),
            200
        );
    }

    #[test]
    fn origins_are_refused_unless_allowed_and_preflights_answered() {
        let none = AccessPolicy::new(vec![], "127.0.0.1", &[], &[]).unwrap();
        let from = |o| head(Some("127.0.0.1:80"), Some(o), None);
        let Decision::Refuse(r) = none.check("POST", &from("https://evil.example"), false) else {
            panic!("a page from another origin was allowed");
        };
        assert_eq!(r.status, 403);
        assert!(
            r.message.contains("--cors-origin https://evil.example"),
            "{}",
            r.message
        );
        let p = AccessPolicy::new(
            vec!["k".into()],
            "127.0.0.1",
            &[],
            &["https://App.example:8443".into()],
        )
        .unwrap();
        assert_eq!(
            status(&p.check("POST", &from("https://evil.example"), false)),
            403
        );
        let mut preflight = from("https://app.example:8443");
        preflight.preflight = true;
        let Decision::Preflight(headers) = p.check("OPTIONS", &preflight, false) else {
            panic!("no preflight answer");
        };
        assert!(headers.contains(&(
            "Access-Control-Allow-Origin",
            "https://app.example:8443".into()
        )));
        assert!(headers
            .iter()
            .any(|(n, v)| *n == "Access-Control-Allow-Headers" && v.contains("Authorization")));
        // the request itself still needs the key, and its refusal is readable by the page
        let Decision::Refuse(r) = p.check("POST", &from("https://app.example:8443"), false) else {
            panic!("allowed without a key");
        };
        assert_eq!((r.status, r.code), (401, Some("invalid_api_key")));
        assert!(r
            .headers
            .iter()
            .any(|(n, _)| *n == "Access-Control-Allow-Origin"));
        let mut keyed = from("https://app.example:8443");
        keyed.authorization = Some("Bearer k".into());
        assert_eq!(
            p.check("POST", &keyed, false),
            Decision::Allow {
                cors: Some("https://app.example:8443".into())
            }
        );
        let any = AccessPolicy::new(vec![], "127.0.0.1", &[], &["*".into()]).unwrap();
        assert_eq!(status(&any.check("POST", &from("null"), false)), 200);
        for bad in ["app.example", "ftp://a", "https://a/path", "https://"] {
            let e = AccessPolicy::new(vec![], "127.0.0.1", &[], &[bad.into()]).unwrap_err();
            assert!(e.to_string().contains("cors-origin"), "{e}");
        }
    }

    #[test]
    fn keys_are_bearer_tokens_and_every_key_is_accepted() {
        let p = AccessPolicy::new(
            vec!["first-key".into(), " second ".into()],
            "127.0.0.1",
            &[],
            &[],
        )
        .unwrap();
        assert!(p.has_keys());
        let with = |a| head(Some("localhost"), None, a);
        for ok in ["Bearer first-key", "bearer second", "  Bearer   second  "] {
            assert_eq!(status(&p.check("GET", &with(Some(ok)), false)), 200, "{ok}");
        }
        for bad in [
            None,
            Some("Bearer first-ke"),
            Some("Bearer first-key2"),
            Some("Basic first-key"),
            Some("first-key"),
            Some("Bearer "),
        ] {
            let Decision::Refuse(r) = p.check("GET", &with(bad), false) else {
                panic!("{bad:?} was accepted");
            };
            assert_eq!(
                (r.status, r.code),
                (401, Some("invalid_api_key")),
                "{bad:?}"
            );
            assert!(r.headers.contains(&("WWW-Authenticate", "Bearer".into())));
        }
        assert!(AccessPolicy::new(vec!["".into()], "127.0.0.1", &[], &[]).is_err());
        assert!(AccessPolicy::new(vec!["a b".into()], "127.0.0.1", &[], &[]).is_err());
        // a public endpoint (the health check) needs no key, but still a good Host
        assert_eq!(status(&p.check("GET", &with(None), true)), 200);
        assert_eq!(
            status(&p.check("GET", &head(Some("evil.example"), None, None), true)),
            421
        );
        let open = AccessPolicy::new(vec![], "127.0.0.1", &[], &[]).unwrap();
        assert_eq!(status(&open.check("GET", &with(None), false)), 200);
    }
}
