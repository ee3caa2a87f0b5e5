//! One mechanism for per-device choices: a choice is measured once on the device at hand, kept
//! under a [`TuneKey`] (what is chosen, adapter, driver, engine version, model shape) in a
//! [`Store`], and reused on the next load without measuring. A record that cannot be read, was
//! written for another key or no longer fits what the caller expects is ignored and replaced:
//! the caller measures again. Nothing here knows what is being chosen.
//!
//! Natively the store is one JSON file per key under the user's cache directory
//! (`$EMBERLM_CACHE_DIR`, else `$XDG_CACHE_HOME/emberlm`, else `~/.cache/emberlm`), written
//! to a temporary file and renamed, so a crash never leaves half a record. In the browser it is
//! the Cache API (`emberlm-tune-v1`), keyed by a synthetic URL.
//!
//! A record carries its format version ([`RECORD_FORMAT`]), its key, the value as JSON text and
//! a checksum of that text. One that is truncated, corrupted (even into other valid JSON), of
//! another format or written for another key is never trusted: it is ignored with a one-line
//! notice (stderr natively, the console in the browser) and the caller measures again, which
//! rewrites it.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// What a tuned choice depends on: records are reused only when every field matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TuneKey {
    /// What is chosen (`kernel-plan`, ...).
    pub what: String,
    /// Adapter name, backend and device type.
    pub adapter: String,
    /// Driver name and version.
    pub driver: String,
    /// The engine's version (kernels change between versions).
    pub engine: String,
    /// The model's shape as far as the choice depends on it (dims, weight types, context).
    pub shape: String,
}

impl TuneKey {
    /// A key for `what` on this engine version.
    pub fn new(what: &str, adapter: String, driver: String, shape: String) -> Self {
        Self {
            what: what.to_string(),
            adapter,
            driver,
            engine: env!("CARGO_PKG_VERSION").to_string(),
            shape,
        }
    }

    /// A short stable name for the record: `what` and a 64-bit FNV-1a hash of every field.
    pub fn slot(&self) -> String {
        let mut fields = Vec::new();
        for field in [
            &self.what,
            &self.adapter,
            &self.driver,
            &self.engine,
            &self.shape,
        ] {
            fields.extend_from_slice(field.as_bytes());
            fields.push(0);
        }
        let h = fnv1a(&fields);
        let what: String = self
            .what
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        format!("{what}-{h:016x}")
    }
}

/// The version of the record layout written; records of any other are ignored.
pub const RECORD_FORMAT: u32 = 2;

/// A stored choice: its layout version, the key it was made for, the value as JSON text and
/// the text's checksum ([`checksum`]).
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    format: u32,
    key: TuneKey,
    value: String,
    checksum: String,
}

/// A record's checksum of its value text: FNV-1a (64 bits) of `bytes`, in hex. It catches a
/// changed byte, not an adversary (whoever edits a record by hand sets it too).
pub fn checksum(bytes: &[u8]) -> String {
    format!("{:016x}", fnv1a(bytes))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What a store holds for a key.
#[derive(Debug, PartialEq)]
pub enum Lookup<T> {
    /// Nothing (or nothing readable as text).
    Missing,
    /// A whole record for this key.
    Found(T),
    /// A record that is not trusted, and why.
    Rejected(String),
}

/// What the text of a stored record holds for `key`: its value, or why it is not trusted (not
/// a record, another format, a checksum that does not match, another key, a value of another
/// shape). What [`Store::lookup`] does with what it read.
pub fn parse_record<T: DeserializeOwned>(text: &str, key: &TuneKey) -> Lookup<T> {
    let record: Record = match serde_json::from_str(text) {
        Ok(r) => r,
        Err(e) => return Lookup::Rejected(format!("it is not a record ({e})")),
    };
    if record.format != RECORD_FORMAT {
        return Lookup::Rejected(format!(
            "format {} (this version reads {RECORD_FORMAT})",
            record.format
        ));
    }
    if checksum(record.value.as_bytes()) != record.checksum {
        return Lookup::Rejected("its checksum does not match (the file was changed)".into());
    }
    if record.key != *key {
        return Lookup::Rejected("it was written for another model or device".into());
    }
    match serde_json::from_str(&record.value) {
        Ok(value) => Lookup::Found(value),
        Err(e) => Lookup::Rejected(format!("its value does not fit ({e})")),
    }
}

/// The text of a record keeping `value` under `key` (what [`Store::save`] writes, and
/// [`parse_record`] reads back).
pub fn record_text<T: Serialize>(key: &TuneKey, value: &T) -> Result<String, String> {
    let value = serde_json::to_string(value).map_err(|e| e.to_string())?;
    let record = Record {
        format: RECORD_FORMAT,
        key: key.clone(),
        checksum: checksum(value.as_bytes()),
        value,
    };
    serde_json::to_string_pretty(&record).map_err(|e| e.to_string())
}

/// Tells the user (one line) that a stored record is ignored.
fn notice(location: &str, why: &str) {
    let line = format!("emberlm: ignoring the stored choice {location}: {why}; measuring again");
    #[cfg(target_arch = "wasm32")]
    web_sys::console::warn_1(&line.into());
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("{line}");
}

/// Where tuned choices are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    /// Nothing is kept: every load measures.
    None,
    /// One file per key in this folder (native only).
    Dir(std::path::PathBuf),
    /// The browser's Cache API (wasm32 only).
    Browser,
}

impl Store {
    /// The platform's store: natively the cache folder (see the module docs; `None` when
    /// `EMBERLM_CACHE_DIR` is set but empty, or no home is known), the Cache API in the browser.
    pub fn platform() -> Self {
        #[cfg(target_arch = "wasm32")]
        {
            Store::Browser
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let env = |k: &str| std::env::var_os(k);
            let dir = match env("EMBERLM_CACHE_DIR") {
                Some(d) if d.is_empty() => return Store::None,
                Some(d) => std::path::PathBuf::from(d),
                None => match (env("XDG_CACHE_HOME"), env("HOME")) {
                    (Some(x), _) if !x.is_empty() => std::path::PathBuf::from(x).join("emberlm"),
                    (_, Some(h)) if !h.is_empty() => {
                        std::path::PathBuf::from(h).join(".cache").join("emberlm")
                    }
                    _ => return Store::None,
                },
            };
            Store::Dir(dir.join("tune"))
        }
    }

    /// Where this store keeps `key` (for reports): a file path or a cache URL.
    pub fn location(&self, key: &TuneKey) -> Option<String> {
        match self {
            Store::None => None,
            Store::Dir(dir) => Some(
                dir.join(format!("{}.json", key.slot()))
                    .display()
                    .to_string(),
            ),
            Store::Browser => Some(browser_url(key)),
        }
    }

    /// The value stored under `key`, or `None` when there is none or the record is not
    /// trusted (see [`Store::lookup`]; a one-line notice says why).
    pub async fn load<T: DeserializeOwned>(&self, key: &TuneKey) -> Option<T> {
        match self.lookup(key).await {
            Lookup::Found(value) => Some(value),
            Lookup::Missing => None,
            Lookup::Rejected(why) => {
                notice(&self.location(key).unwrap_or_default(), &why);
                None
            }
        }
    }

    /// What is stored under `key`: the value, nothing, or a record rejected because it does not
    /// parse, is of another format, fails its checksum, was written for a different key (a hash
    /// collision or a copied file) or holds a value of another shape.
    pub async fn lookup<T: DeserializeOwned>(&self, key: &TuneKey) -> Lookup<T> {
        match self.read(key).await {
            Some(text) => parse_record(&text, key),
            None => Lookup::Missing,
        }
    }

    /// Keeps `value` under `key`, replacing what was there. Failing to persist is not an error
    /// for the caller (the choice still holds for this load): the reason comes back as text.
    pub async fn save<T: Serialize>(&self, key: &TuneKey, value: &T) -> Result<(), String> {
        let text = record_text(key, value)?;
        self.write(key, &text).await
    }

    async fn read(&self, key: &TuneKey) -> Option<String> {
        match self {
            Store::None => None,
            #[cfg(not(target_arch = "wasm32"))]
            Store::Dir(dir) => {
                std::fs::read_to_string(dir.join(format!("{}.json", key.slot()))).ok()
            }
            #[cfg(target_arch = "wasm32")]
            Store::Dir(_) => None,
            #[cfg(target_arch = "wasm32")]
            Store::Browser => browser::read(&browser_url(key)).await,
            #[cfg(not(target_arch = "wasm32"))]
            Store::Browser => None,
        }
    }

    async fn write(&self, key: &TuneKey, text: &str) -> Result<(), String> {
        match self {
            Store::None => Ok(()),
            #[cfg(not(target_arch = "wasm32"))]
            Store::Dir(dir) => {
                let io = |what: &str, e: std::io::Error| format!("{what} {}: {e}", dir.display());
                std::fs::create_dir_all(dir).map_err(|e| io("creating", e))?;
                let path = dir.join(format!("{}.json", key.slot()));
                // unique per process and per call: loads in several threads may save at once
                static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let n = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let tmp = dir.join(format!(
                    "{}.json.{}-{n}.tmp",
                    key.slot(),
                    std::process::id()
                ));
                std::fs::write(&tmp, text).map_err(|e| io("writing in", e))?;
                std::fs::rename(&tmp, &path).map_err(|e| {
                    let _ = std::fs::remove_file(&tmp);
                    io("renaming in", e)
                })
            }
            #[cfg(target_arch = "wasm32")]
            Store::Dir(_) => Err("no file system in the browser".into()),
            #[cfg(target_arch = "wasm32")]
            Store::Browser => browser::write(&browser_url(key), text).await,
            #[cfg(not(target_arch = "wasm32"))]
            Store::Browser => Err("the Cache API exists only in the browser".into()),
        }
    }
}

/// The synthetic URL a record is kept under in the Cache API (never fetched).
fn browser_url(key: &TuneKey) -> String {
    format!("https://emberlm.tune/v1/{}.json", key.slot())
}

#[cfg(target_arch = "wasm32")]
mod browser {
    use wasm_bindgen::{JsCast, JsValue};
    use wasm_bindgen_futures::JsFuture;
    use web_sys::{Cache, CacheStorage, Response};

    const CACHE: &str = "emberlm-tune-v1";

    async fn open() -> Option<Cache> {
        let global = js_sys::global();
        let caches: CacheStorage = js_sys::Reflect::get(&global, &JsValue::from_str("caches"))
            .ok()?
            .dyn_into()
            .ok()?;
        JsFuture::from(caches.open(CACHE))
            .await
            .ok()?
            .dyn_into()
            .ok()
    }

    pub(super) async fn read(url: &str) -> Option<String> {
        let cache = open().await?;
        let found = JsFuture::from(cache.match_with_str(url)).await.ok()?;
        let response: Response = found.dyn_into().ok()?;
        JsFuture::from(response.text().ok()?)
            .await
            .ok()?
            .as_string()
    }

    pub(super) async fn write(url: &str, text: &str) -> Result<(), String> {
        let cache = open().await.ok_or("the Cache API is not available")?;
        let response = Response::new_with_opt_str(Some(text)).map_err(|e| format!("{e:?}"))?;
        JsFuture::from(cache.put_with_str(url, &response))
            .await
            .map(|_| ())
            .map_err(|e| format!("Cache API put failed: {e:?}"))
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    fn key(shape: &str) -> TuneKey {
        TuneKey::new(
            "kernel-plan",
            "llvmpipe [Vulkan, Cpu]".into(),
            "Mesa".into(),
            shape.into(),
        )
    }

    fn temp_store(name: &str) -> (Store, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("emberlm-tune-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        (Store::Dir(dir.clone()), dir)
    }

    #[test]
    fn saved_values_come_back_for_their_key_only() {
        let (store, dir) = temp_store("roundtrip");
        let a = key("d=576");
        pollster::block_on(store.save(&a, &vec![1u32, 2, 3])).unwrap();
        assert_eq!(
            pollster::block_on(store.load::<Vec<u32>>(&a)),
            Some(vec![1, 2, 3])
        );
        assert_eq!(
            pollster::block_on(store.load::<Vec<u32>>(&key("d=64"))),
            None
        );
        // the wrong type reads as missing, not as an error
        assert_eq!(pollster::block_on(store.load::<String>(&a)), None);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn corrupt_or_foreign_records_are_ignored() {
        let (store, dir) = temp_store("corrupt");
        let a = key("d=576");
        let path = std::path::PathBuf::from(store.location(&a).unwrap());
        std::fs::create_dir_all(&dir).unwrap();
        for bad in [
            "",
            "{",
            "null",
            "{\"key\": 1, \"value\": 2}",
            "\u{0}\u{1}garbage",
        ] {
            std::fs::write(&path, bad).unwrap();
            assert_eq!(pollster::block_on(store.load::<u32>(&a)), None, "{bad:?}");
        }
        // a record written for another key, copied into this slot (a stale file)
        let b = key("d=64");
        pollster::block_on(store.save(&b, &7u32)).unwrap();
        let other = std::fs::read_to_string(store.location(&b).unwrap()).unwrap();
        std::fs::write(&path, &other).unwrap();
        let rejected = pollster::block_on(store.lookup::<u32>(&a));
        assert!(
            matches!(&rejected, Lookup::Rejected(w) if w.contains("another model")),
            "{rejected:?}"
        );
        // a whole record whose value was changed into other valid JSON
        pollster::block_on(store.save(&a, &9u32)).unwrap();
        let good = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, good.replace("\"9\"", "\"8\"")).unwrap();
        let rejected = pollster::block_on(store.lookup::<u32>(&a));
        assert!(
            matches!(&rejected, Lookup::Rejected(w) if w.contains("checksum")),
            "{rejected:?}"
        );
        // every truncation of a whole record
        for cut in 0..good.len() {
            std::fs::write(&path, &good[..cut]).unwrap();
            assert_eq!(
                pollster::block_on(store.load::<u32>(&a)),
                None,
                "cut at {cut}"
            );
        }
        // the format before this one (key and value side by side), and a future one
        let old = format!(
            "{{\"key\": {}, \"value\": 9}}",
            serde_json::to_string(&a).unwrap()
        );
        std::fs::write(&path, old).unwrap();
        assert_eq!(pollster::block_on(store.load::<u32>(&a)), None);
        std::fs::write(&path, good.replace("\"format\": 2", "\"format\": 3")).unwrap();
        let rejected = pollster::block_on(store.lookup::<u32>(&a));
        assert!(
            matches!(&rejected, Lookup::Rejected(w) if w.contains("format 3")),
            "{rejected:?}"
        );
        // a value of another shape
        pollster::block_on(store.save(&a, &"text")).unwrap();
        assert_eq!(pollster::block_on(store.load::<u32>(&a)), None);
        // and rewriting repairs it
        pollster::block_on(store.save(&a, &9u32)).unwrap();
        assert_eq!(pollster::block_on(store.load::<u32>(&a)), Some(9));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn concurrent_saves_leave_one_whole_record() {
        let (store, dir) = temp_store("concurrent");
        let a = key("d=576");
        std::thread::scope(|s| {
            for t in 0..8u32 {
                let store = &store;
                let a = &a;
                s.spawn(move || {
                    for i in 0..25u32 {
                        pollster::block_on(store.save(a, &(t * 1000 + i))).unwrap();
                        // every read sees some whole record, never a mix or a torn file
                        let seen = pollster::block_on(store.lookup::<u32>(a));
                        assert!(matches!(seen, Lookup::Found(_)), "{seen:?}");
                    }
                });
            }
        });
        let last = pollster::block_on(store.load::<u32>(&a)).unwrap();
        assert_eq!(last % 1000, 24);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "temporary files left: {left:?}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn slots_differ_by_every_field() {
        let base = key("s");
        let mut seen = std::collections::HashSet::new();
        seen.insert(base.slot());
        for f in 0..5 {
            let mut k = base.clone();
            match f {
                0 => k.what.push('x'),
                1 => k.adapter.push('x'),
                2 => k.driver.push('x'),
                3 => k.engine.push('x'),
                _ => k.shape.push('x'),
            }
            assert!(seen.insert(k.slot()), "field {f}");
        }
        assert!(base.slot().starts_with("kernel-plan-"));
    }

    #[test]
    fn none_store_keeps_nothing() {
        pollster::block_on(Store::None.save(&key("s"), &1u32)).unwrap();
        assert_eq!(pollster::block_on(Store::None.load::<u32>(&key("s"))), None);
    }
}
