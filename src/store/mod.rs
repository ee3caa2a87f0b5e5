//! Models kept in the page's storage between visits: how a stored download is named, what is
//! recorded beside its bytes, how much room it needs, and how a cut-off download resumes. Pure
//! logic, built natively too (tested and fuzzed there); the Origin Private File System and the
//! Cache API themselves are reached from `web`.
//!
//! A store is a folder named by the `cache` load option. Each URL kept there is a folder of its
//! own (named by [`entry_name`]) holding a [`StoredRecord`] (`record.json`) and the file's bytes
//! as numbered parts of at most [`PART_BYTES`] ([`part_name`]), written one by one as the
//! download streams in: a download cut off part-way keeps every part written so far, and the next
//! load asks the server for the rest only.

pub mod range;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The most bytes one stored part holds. Parts are written whole (the browser commits a
/// written file when it is closed), so this is the most a page closed mid-download loses.
pub const PART_BYTES: usize = 16 << 20;

/// The version of [`StoredRecord`]'s layout; a record of another version is not read (its
/// entry is fetched again).
pub const RECORD_VERSION: u32 = 1;

/// The record file's name inside an entry's folder.
pub const RECORD_FILE: &str = "record.json";

/// The largest record read (a record is a few hundred bytes; anything larger is not ours).
const RECORD_MAX_BYTES: usize = 64 * 1024;

/// The root folder of every store in the origin's private file system.
pub const ROOT_FOLDER: &str = "emberlm";

/// Which browser storage a store lives in (the `storage` load option).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    /// The Origin Private File System where the browser has it, else the Cache API.
    Auto,
    /// The Origin Private File System: files written in parts as they stream in.
    Opfs,
    /// The Cache API: one response per file, stored whole once the model has parsed.
    CacheApi,
}

impl Medium {
    /// Reads the `storage` option (`'auto'`, `'opfs'`, `'cacheApi'`; any case, `-` or `_`
    /// between the words).
    pub fn parse(text: &str) -> Result<Self> {
        let folded: String = text
            .chars()
            .filter(|c| !matches!(c, '-' | '_' | ' '))
            .collect::<String>()
            .to_ascii_lowercase();
        match folded.as_str() {
            "auto" => Ok(Medium::Auto),
            "opfs" => Ok(Medium::Opfs),
            "cacheapi" | "cache" => Ok(Medium::CacheApi),
            _ => Err(Error::invalid(
                "storage",
                format!("`{text}`: expected 'auto', 'opfs' or 'cacheApi'"),
            )),
        }
    }

    /// The name JavaScript sees (`engine.info().storage`, `StoredFile.storage`).
    pub fn js_name(self) -> &'static str {
        match self {
            Medium::Auto => "auto",
            Medium::Opfs => "opfs",
            Medium::CacheApi => "cacheApi",
        }
    }
}

/// What is kept beside a stored file's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StoredRecord {
    /// [`RECORD_VERSION`].
    pub version: u32,
    /// The URL the bytes came from (the entry's key).
    pub url: String,
    /// The file's length: the server's `Content-Length` while downloading (0 when it sent none),
    /// the bytes received once complete.
    pub bytes: u64,
    /// Whether every byte is stored (the parts hold exactly `bytes`).
    pub complete: bool,
    /// The server's `ETag` for the file, when it exposed one: a resumed download whose `ETag`
    /// differs is a different file and starts again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// The server's `Last-Modified`, compared as `etag` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_modified: Option<String>,
}

impl StoredRecord {
    /// A record for a download of `url` just started.
    pub fn started(url: &str, bytes: u64, etag: Option<String>, modified: Option<String>) -> Self {
        Self {
            version: RECORD_VERSION,
            url: url.to_string(),
            bytes,
            complete: false,
            etag,
            last_modified: modified,
        }
    }

    /// The record as stored.
    pub fn to_json(&self) -> String {
        // a struct of strings, numbers and flags always serialises
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a stored record; `what` names it in errors. Refuses another version, a record too
    /// large to be one, and a complete record of more bytes than a file can have here.
    pub fn parse(text: &[u8], what: &str) -> Result<Self> {
        if text.len() > RECORD_MAX_BYTES {
            return Err(Error::format(
                what,
                format!(
                    "{} bytes: not a stored record (at most {RECORD_MAX_BYTES})",
                    text.len()
                ),
            ));
        }
        let record: StoredRecord = serde_json::from_slice(text)
            .map_err(|e| Error::format(what, format!("not a stored record: {e}")))?;
        if record.version != RECORD_VERSION {
            return Err(Error::format(
                what,
                format!(
                    "a stored record of version {} (this build reads {RECORD_VERSION})",
                    record.version
                ),
            ));
        }
        if record.url.is_empty() {
            return Err(Error::format(what, "a stored record without its URL"));
        }
        Ok(record)
    }

    /// Whether a response's validators say the server still has the file this record began:
    /// `ETag`s equal when both are known, else `Last-Modified`s equal when both are known, else
    /// (nothing to compare) the same.
    pub fn same_file(&self, etag: Option<&str>, modified: Option<&str>) -> bool {
        match (self.etag.as_deref(), etag) {
            (Some(a), Some(b)) => a == b,
            _ => match (self.last_modified.as_deref(), modified) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            },
        }
    }
}

/// The folder name of `url`'s entry: 32 hex digits of the URL's SHA-256 (a URL holds characters
/// no file name may, and may be longer than one).
pub fn entry_name(url: &str) -> String {
    hex(&Sha256::digest(url.as_bytes())[..16])
}

/// The folder name of the store called `store` inside [`ROOT_FOLDER`]: the name itself when it
/// is a plain one (letters, digits, `.`, `_`, `-`; not `.` or `..`), else `store-` and 16 hex
/// digits of its SHA-256.
pub fn folder_name(store: &str) -> String {
    let plain = !store.is_empty()
        && store.len() <= 100
        && store != "."
        && store != ".."
        && store
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if plain {
        store.to_string()
    } else {
        format!("store-{}", hex(&Sha256::digest(store.as_bytes())[..8]))
    }
}

/// The file name of part `index` of a stored file (`part-00000`, ...).
pub fn part_name(index: usize) -> String {
    format!("part-{index:05}")
}

/// The part index a file name stands for, when it is one ([`part_name`]'s inverse).
pub fn part_index(name: &str) -> Option<usize> {
    let digits = name.strip_prefix("part-")?;
    if digits.len() != 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Lowercase hexadecimal.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The SHA-256 digests of the `sha256` load option: one per file in part order, written as 64
/// hex digits each and separated by commas or white space.
pub fn parse_digests(text: &str) -> Result<Vec<[u8; 32]>> {
    let mut out = Vec::new();
    for word in text.split(|c: char| c == ',' || c.is_whitespace()) {
        if word.is_empty() {
            continue;
        }
        let word = word.strip_prefix("sha256:").unwrap_or(word);
        if word.len() != 64 || !word.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::invalid(
                "sha256",
                format!(
                    "`{}` is not a SHA-256 digest (64 hex digits; one per file, in part order, \
                     separated by commas)",
                    word.chars().take(80).collect::<String>()
                ),
            ));
        }
        let mut digest = [0u8; 32];
        for (i, d) in digest.iter_mut().enumerate() {
            let pair = word.get(2 * i..2 * i + 2).unwrap_or("00");
            *d = u8::from_str_radix(pair, 16).unwrap_or(0);
        }
        out.push(digest);
    }
    if out.is_empty() {
        return Err(Error::invalid(
            "sha256",
            "no digest given (64 hex digits per file)",
        ));
    }
    Ok(out)
}

/// Refuses to store `needed` more bytes of `what` when the origin's quota leaves less free (the
/// numbers of `navigator.storage.estimate()`): checked before anything is written.
pub fn check_room(what: &str, needed: u64, quota: u64, used: u64) -> Result<()> {
    let free = quota.saturating_sub(used);
    if needed > free {
        return Err(Error::Quota {
            what: what.to_string(),
            needed,
            free,
            quota,
            used,
        });
    }
    Ok(())
}

/// Checks a file's bytes against the digest the caller gave for it.
pub fn check_digest(what: &str, expected: &[u8; 32], got: &[u8]) -> Result<()> {
    if got != expected.as_slice() {
        return Err(Error::format(
            what,
            format!(
                "SHA-256 {} but the `sha256` option expects {}",
                hex(got),
                hex(expected)
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
