//! A model's bytes from what JavaScript hands `Engine.load`: a URL (fetched with download
//! progress, optionally through a store: [`super::download`]), a File/Blob (read as a stream),
//! or bytes; or a list of those, the parts of a split GGUF set (a first part's URL brings the
//! others).

use std::cell::RefCell;

use js_sys::{ArrayBuffer, Reflect, Uint8Array};
use sha2::{Digest, Sha256};
use wasm_bindgen::prelude::*;
use web_sys::{Blob, Cache, ReadableStream};

use super::download::{self, url_file_name};
use super::stored::{self, Store};
use crate::loader::ModelFiles;
use crate::{Error, Result};

/// One file of a model, read into memory.
pub(crate) struct FetchedPart {
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// A name for messages: the URL's last segment, the File's name, or the caller's.
    pub name: String,
    /// A Cache API cache to store it in under its URL once the model has parsed (a URL
    /// fetched from the network with a Cache API store).
    pub cache_after: Option<(Cache, String)>,
}

/// A model's files read into memory: one, or every part of a split GGUF set.
pub(crate) struct Fetched {
    /// The files in the order given (a split set is put in part order when it is parsed).
    pub parts: Vec<FetchedPart>,
    /// The model's name: the caller's, or the first file's.
    pub name: String,
    /// Every file was read from the store rather than the network.
    pub from_cache: bool,
    /// Every file is in the store now (or will be, once `cache_after` is written).
    pub stored: bool,
    /// Bytes received from the network.
    pub downloaded: u64,
    /// `navigator.storage.persist()`'s answer, when this load asked.
    pub persisted: Option<bool>,
    /// Why a file could not be kept in the store, when one could not.
    pub store_error: Option<String>,
}

/// What [`Source::store_first`] did.
pub(crate) struct StoredFirst {
    /// Every file was in the store already.
    pub from_store: bool,
    /// Bytes received from the network.
    pub downloaded: u64,
    /// `navigator.storage.persist()`'s answer, when this load asked.
    pub persisted: Option<bool>,
}

/// What `Engine.load` was given.
pub(crate) enum Source {
    /// A URL to fetch.
    Url(String),
    /// A File or Blob.
    Blob(Blob),
    /// Bytes already in memory.
    Bytes(Vec<u8>),
    /// Every file of a model in several (a split GGUF set), one source each.
    Parts(Vec<Source>),
}

fn get(target: &JsValue, key: &str) -> JsValue {
    Reflect::get(target, &JsValue::from_str(key)).unwrap_or(JsValue::UNDEFINED)
}

/// A File or bytes opened for reading: its length and its bytes to come.
struct Opened {
    name: String,
    total: u64,
    body: Body,
}

enum Body {
    Stream(ReadableStream),
    Bytes(Vec<u8>),
}

/// A set's total for its progress: the sum of its files' sizes once every one is known, else 0.
fn set_total(sizes: &[Option<u64>]) -> u64 {
    match sizes.iter().all(Option::is_some) {
        true => sizes
            .iter()
            .flatten()
            .fold(0u64, |t, n| t.saturating_add(*n)),
        false => 0,
    }
}

impl Source {
    /// Recognises a URL string (or an object with an `href`, such as `URL`), a Blob, an
    /// ArrayBuffer or any ArrayBuffer view; or a list of those, or a `FileList`, as the files of
    /// one model. A URL whose file name is the first part of a split GGUF set
    /// (`NAME-00001-of-0000N.gguf`, N > 1) stands for every part, each beside it.
    pub fn from_js(value: &JsValue) -> Result<Self> {
        if js_sys::Array::is_array(value) {
            let list: &js_sys::Array = value.unchecked_ref();
            let parts = list
                .iter()
                .map(|v| Self::one_from_js(&v))
                .collect::<Result<Vec<_>>>()?;
            return Self::parts(parts);
        }
        if let Some(list) = value.dyn_ref::<web_sys::FileList>() {
            let parts = (0..list.length())
                .filter_map(|i| list.get(i))
                .map(|f| Source::Blob(f.into()))
                .collect();
            return Self::parts(parts);
        }
        Ok(Self::one_from_js(value)?.expanded())
    }

    /// A list of files: none is an error, one stands alone.
    fn parts(mut parts: Vec<Source>) -> Result<Self> {
        match parts.len() {
            0 => Err(Error::invalid("source", "an empty list of model files")),
            1 => Ok(parts
                .pop()
                .map_or(Source::Parts(Vec::new()), Source::expanded)),
            _ => Ok(Source::Parts(parts)),
        }
    }

    /// The URL of a split set's first part as the URLs of every part; anything else as it is.
    fn expanded(self) -> Self {
        match &self {
            Source::Url(url) => match crate::format::gguf_split::part_urls(url) {
                Some(urls) => Source::Parts(urls.into_iter().map(Source::Url).collect()),
                None => self,
            },
            _ => self,
        }
    }

    fn one_from_js(value: &JsValue) -> Result<Self> {
        if let Some(url) = value.as_string().or_else(|| get(value, "href").as_string()) {
            return Ok(Source::Url(url));
        }
        if let Some(blob) = value.dyn_ref::<Blob>() {
            return Ok(Source::Blob(blob.clone()));
        }
        if let Some(buffer) = value.dyn_ref::<ArrayBuffer>() {
            return Ok(Source::Bytes(Uint8Array::new(buffer).to_vec()));
        }
        if ArrayBuffer::is_view(value) {
            let buffer = get(value, "buffer");
            let offset = get(value, "byteOffset").as_f64().unwrap_or(0.0) as u32;
            let length = get(value, "byteLength").as_f64().unwrap_or(0.0) as u32;
            let view = Uint8Array::new_with_byte_offset_and_length(&buffer, offset, length);
            return Ok(Source::Bytes(view.to_vec()));
        }
        Err(Error::invalid(
            "source",
            "expected a URL string, a File or Blob, an ArrayBuffer or a Uint8Array (or a list \
             of those: the parts of a split GGUF set)",
        ))
    }

    /// Reads every file, reporting `progress(loaded, total)` over all of them (total 0 while
    /// any file's size is unknown: a URL not yet opened, or one without `Content-Length`).
    /// `store` keeps URL sources between loads; `digests` are the `sha256` option's, one per
    /// file in order. `name` names the model (and its file, when it is one). The files are read
    /// one after another, each URL fetched only once the file before it has been read: a
    /// browser keeps at most six HTTP/1.1 connections to one host, and a body not yet read
    /// holds its connection. Before each file's body is read, the sizes known so far are
    /// checked against the wasm32 address space.
    pub async fn read(
        self,
        name: Option<String>,
        store: Option<&Store>,
        digests: Option<&[[u8; 32]]>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Fetched> {
        let sources = match self {
            Source::Parts(parts) => parts,
            one => vec![one],
        };
        check_digest_count(digests, sources.len())?;
        let single = sources.len() == 1;
        let known: RefCell<Vec<Option<u64>>> =
            RefCell::new(sources.iter().map(Source::size_now).collect());
        let total_now = || set_total(&known.borrow());
        let mut done = 0u64;
        let mut out = Fetched {
            parts: Vec::with_capacity(sources.len()),
            name: String::new(),
            from_cache: true,
            stored: store.is_some(),
            downloaded: 0,
            persisted: None,
            store_error: None,
        };
        for (i, source) in sources.into_iter().enumerate() {
            let own_name = if single { name.clone() } else { None };
            let digest = digests.and_then(|d| d.get(i));
            let what = name
                .clone()
                .or_else(|| out.parts.first().map(|p| p.name.clone()));
            // every size known so far, this file's `total` (0: unknown) included, must fit
            let fits = |total: Option<u64>, named: &str| {
                let mut k = known.borrow_mut();
                if let (Some(size), Some(t)) = (k.get_mut(i), total) {
                    *size = Some(t).filter(|&t| t > 0);
                }
                let sum = k.iter().flatten().fold(0u64, |t, n| t.saturating_add(*n));
                crate::model::file_bytes::check_fits_wasm32(sum, what.as_deref().unwrap_or(named))
            };
            let at = done;
            let mut each = |loaded: u64, _: u64| {
                let now = at.saturating_add(loaded);
                let total = total_now();
                progress(now, if total > 0 { total.max(now) } else { 0 });
            };
            let part = match source {
                Source::Url(url) => {
                    let file_name = own_name.unwrap_or_else(|| url_file_name(&url));
                    let mut fits_url = |total: u64| fits(Some(total), &file_name);
                    let got =
                        download::read_url(&url, store, digest, &mut fits_url, &mut each, true)
                            .await?;
                    out.from_cache &= got.from_store;
                    out.stored &= got.stored || got.cache_after.is_some();
                    out.downloaded = out.downloaded.saturating_add(got.downloaded);
                    out.persisted = out.persisted.or(got.persisted);
                    out.store_error = out.store_error.take().or(got.store_error);
                    FetchedPart {
                        bytes: got.bytes,
                        name: file_name,
                        cache_after: got.cache_after.map(|c| (c, url)),
                    }
                }
                other => {
                    out.from_cache = false;
                    out.stored = false;
                    let o = other.open(own_name)?;
                    fits(None, &o.name)?;
                    let bytes = match o.body {
                        Body::Bytes(bytes) => {
                            let n = bytes.len() as u64;
                            each(n, n);
                            bytes
                        }
                        Body::Stream(stream) => {
                            super::pump::read_all(&stream, o.total, &o.name, &mut each).await?
                        }
                    };
                    if let Some(want) = digest {
                        let got: [u8; 32] = Sha256::digest(&bytes).into();
                        crate::store::check_digest(&o.name, want, &got)?;
                    }
                    FetchedPart {
                        bytes,
                        name: o.name,
                        cache_after: None,
                    }
                }
            };
            done = done.saturating_add(part.bytes.len() as u64);
            out.parts.push(part);
        }
        out.name = name
            .or_else(|| out.parts.first().map(|p| p.name.clone()))
            .unwrap_or_else(|| "model.gguf".to_string());
        Ok(out)
    }

    /// Downloads every file into the private file system store without the page holding it
    /// (one part in memory at a time: [`download::read_url`] with `keep` false), so that
    /// [`Source::as_blobs`] then finds each whole and the load reads it back a range at a time,
    /// past what wasm32 memory could hold. Files the store holds whole already are not fetched.
    /// `digests` (one per file, in order) are checked over every file's bytes, those that arrive
    /// and those the store held. `None` (nothing done) where that cannot be: a file that is not
    /// a URL, or a store other than the private file system.
    pub async fn store_first(
        &self,
        store: Option<&Store>,
        digests: Option<&[[u8; 32]]>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Option<StoredFirst>> {
        let urls = self.urls().unwrap_or_default();
        if urls.is_empty() || !matches!(store, Some(Store::Opfs(..))) {
            return Ok(None);
        }
        check_digest_count(digests, urls.len())?;
        let mut out = StoredFirst {
            from_store: true,
            downloaded: 0,
            persisted: None,
        };
        let mut done = 0u64;
        // each file's size once its download said it (the set's total: their sum, once every
        // one is known)
        let mut sizes: Vec<Option<u64>> = vec![None; urls.len()];
        for (i, url) in urls.iter().enumerate() {
            let digest = digests.and_then(|d| d.get(i));
            // the file's length as its progress last said (a resumed file's counts what the
            // store held before)
            let mut length = 0u64;
            let mut each = |loaded: u64, total: u64| {
                length = loaded;
                if total > 0 {
                    sizes[i] = Some(total);
                }
                let now = done.saturating_add(loaded);
                let total = set_total(&sizes);
                progress(now, if total > 0 { total.max(now) } else { 0 });
            };
            let mut anything = |_: u64| Ok(());
            let got =
                download::read_url(url, store, digest, &mut anything, &mut each, false).await?;
            out.from_store &= got.from_store;
            out.downloaded = out.downloaded.saturating_add(got.downloaded);
            out.persisted = out.persisted.or(got.persisted);
            done = done.saturating_add(length);
        }
        Ok(Some(out))
    }

    /// The files as Blobs to read a range at a time, each with its name, where every one is a
    /// File or Blob, or a URL whose download `store` holds whole in the Origin Private File
    /// System; `None` otherwise (bytes, a URL to fetch, the Cache API). `name` names a single
    /// file. A `sha256` is not checked here: the caller decides whether these may be read by
    /// range unchecked.
    pub async fn as_blobs(
        &self,
        name: Option<&str>,
        store: Option<&Store>,
    ) -> Result<Option<Vec<(Blob, String)>>> {
        let sources: Vec<&Source> = match self {
            Source::Parts(parts) => parts.iter().collect(),
            one => vec![one],
        };
        let single = sources.len() == 1;
        let mut out = Vec::with_capacity(sources.len());
        for source in sources {
            let own = name.filter(|_| single).map(String::from);
            let found = match (source, store) {
                (Source::Blob(blob), _) => Some((
                    blob.clone(),
                    own.or_else(|| get(blob, "name").as_string())
                        .filter(|n| !n.is_empty())
                        .unwrap_or_else(|| "model.gguf".to_string()),
                )),
                (Source::Url(url), Some(Store::Opfs(s, _))) => match s.entry(url).await? {
                    Some(entry) if entry.is_complete() => {
                        Some((entry.blob()?, own.unwrap_or_else(|| url_file_name(url))))
                    }
                    _ => None,
                },
                _ => None,
            };
            match found {
                Some(f) => out.push(f),
                None => return Ok(None),
            }
        }
        Ok(Some(out))
    }

    /// The files' URLs, in order, where every file is a URL; `None` otherwise.
    pub fn urls(&self) -> Option<Vec<String>> {
        match self {
            Source::Url(u) => Some(vec![u.clone()]),
            Source::Parts(parts) => parts
                .iter()
                .map(|p| match p {
                    Source::Url(u) => Some(u.clone()),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }

    /// Whether the files are URLs (read from the store when [`Source::as_blobs`] finds them).
    pub fn is_url(&self) -> bool {
        match self {
            Source::Url(_) => true,
            Source::Parts(parts) => parts.iter().all(Source::is_url),
            _ => false,
        }
    }

    /// A file's size before it is opened: a File's or bytes'; a URL's is known only from its
    /// response.
    fn size_now(&self) -> Option<u64> {
        match self {
            Source::Blob(blob) => Some(blob.size() as u64),
            Source::Bytes(bytes) => Some(bytes.len() as u64),
            Source::Url(_) | Source::Parts(_) => None,
        }
    }

    /// Opens a File or bytes for reading (a URL is read by [`download::read_url`]; a list
    /// inside a list is refused).
    fn open(self, name: Option<String>) -> Result<Opened> {
        match self {
            Source::Blob(blob) => Ok(Opened {
                total: blob.size() as u64,
                name: name
                    .or_else(|| get(&blob, "name").as_string())
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| "model.gguf".to_string()),
                body: Body::Stream(blob.stream()),
            }),
            Source::Bytes(bytes) => Ok(Opened {
                total: bytes.len() as u64,
                name: name.unwrap_or_else(|| "model.gguf".to_string()),
                body: Body::Bytes(bytes),
            }),
            Source::Url(_) | Source::Parts(_) => Err(Error::invalid(
                "source",
                "a list of model files inside a list: give one flat list of every part",
            )),
        }
    }
}

/// A file to put in a Cache API cache once the model has parsed: the cache, the URL, and the
/// address of the file's bytes (the parser keeps the very buffer it was given, so a file is
/// found again by it).
pub(crate) type ToCache = (Cache, String, usize);

/// The files as the parser takes them (`(bytes, name)`), and the Cache API entries to write once
/// it has parsed them.
pub(crate) fn into_files(parts: Vec<FetchedPart>) -> (Vec<(Vec<u8>, String)>, Vec<ToCache>) {
    let mut to_cache = Vec::new();
    let files = parts
        .into_iter()
        .map(|p| {
            if let Some((cache, url)) = p.cache_after {
                to_cache.push((cache, url, p.bytes.as_ptr() as usize));
            }
            (p.bytes, p.name)
        })
        .collect();
    (files, to_cache)
}

/// Writes each file fetched for a Cache API store into it, streamed a chunk at a time. `Err`
/// with the first refusal (naming the file), after trying every file.
pub(crate) async fn put_in_cache(to_cache: Vec<ToCache>, files: &ModelFiles) -> Result<(), String> {
    let mut failure = None;
    for (cache, url, address) in to_cache {
        let data = files
            .file_data()
            .into_iter()
            .find(|d| d.as_ptr() as usize == address);
        let done = match data {
            Some(data) => stored::put_in_cache(&cache, &url, data).await,
            None => Err("the parsed model no longer holds the file".to_string()),
        };
        if let Err(e) = done {
            failure.get_or_insert(format!("the Cache API did not store {url}: {e}"));
        }
    }
    failure.map_or(Ok(()), Err)
}

/// Refuses `sha256` digests that are not one per file (`files` of them).
fn check_digest_count(digests: Option<&[[u8; 32]]>, files: usize) -> Result<()> {
    match digests.filter(|d| d.len() != files) {
        Some(d) => Err(Error::invalid(
            "sha256",
            format!(
                "{} digest(s) for {files} file(s): give one per file, in part order",
                d.len()
            ),
        )),
        None => Ok(()),
    }
}
