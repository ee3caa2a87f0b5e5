//! A download's bytes as they arrive: read from a stream into memory (reserved up front where
//! the length is known), hashed when a digest is to be checked, and written to a store entry in
//! whole parts ([`crate::store::PART_BYTES`]), the tail when the stream breaks or ends.

use js_sys::{Reflect, Uint8Array};
use sha2::{Digest, Sha256};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{Blob, Cache, ReadableStream, ReadableStreamDefaultReader};

use super::opfs::{js_text, EntryWriter, OpfsStore};
use crate::error::{Error, Result};
use crate::store::{StoredRecord, PART_BYTES};

/// One file as read.
pub(crate) struct UrlFile {
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Read from the store, not the network.
    pub from_store: bool,
    /// Bytes received from the network by this load (a resume receives only the rest; a
    /// restart counts what it discarded too).
    pub downloaded: u64,
    /// Whether the store now holds the file whole (for the Cache API, once `cache_after` has
    /// been written).
    pub stored: bool,
    /// A Cache API cache to put the file in once the model has parsed.
    pub cache_after: Option<Cache>,
    /// `navigator.storage.persist()`'s answer, when this load asked.
    pub persisted: Option<bool>,
    /// Why the file could not be kept in the store (the load went on without it).
    pub store_error: Option<String>,
}

/// Reports at most one progress event per this many bytes (and the last one).
const PROGRESS_STEP: u64 = 1 << 20;

/// An I/O error about `what` (a URL or file name).
pub(super) fn io(what: &str, message: impl Into<String>) -> Error {
    Error::Io {
        path: what.to_string(),
        message: message.into(),
    }
}

/// The file's bytes as they arrive, and their digest when one is to be checked.
///
/// A sink that keeps the file holds every byte; one that does not (a download written to the
/// store only, to be read back a range at a time) holds only what the store has not yet taken:
/// at most one part and the chunk that arrived last.
pub(super) struct Sink {
    /// The bytes held: the file's from byte `base` on.
    pub(super) bytes: Vec<u8>,
    /// Bytes before `bytes[0]`, handed to the store and let go (always 0 when keeping).
    pub(super) base: u64,
    /// Whether the file's bytes are kept in memory (to parse it whole).
    pub(super) keep: bool,
    pub(super) hasher: Option<Sha256>,
}

impl Sink {
    /// A sink that keeps every byte (`keep`) or only what the store has not taken, hashing
    /// them when `hash`.
    pub(super) fn new(keep: bool, hash: bool) -> Self {
        Self {
            bytes: Vec::new(),
            base: 0,
            keep,
            hasher: hash.then(Sha256::new),
        }
    }

    /// Reserves room for `more` bytes beyond those held (a growing buffer would pass through
    /// twice the file's size, and wasm memory never shrinks); where it cannot, the buffer grows
    /// as bytes arrive and fails then with the numbers. Nothing for a sink that does not keep.
    pub(super) fn reserve(&mut self, more: u64) {
        let _ = self.try_reserve(more);
    }

    /// Reserves room for exactly `more` bytes beyond those held; `false` where the page's
    /// memory cannot hold them (always `true` for a sink that does not keep).
    pub(super) fn try_reserve(&mut self, more: u64) -> bool {
        !self.keep || usize::try_from(more).is_ok_and(|n| self.bytes.try_reserve_exact(n).is_ok())
    }

    pub(super) fn reset(&mut self) {
        self.bytes.clear();
        self.base = 0;
        if self.hasher.is_some() {
            self.hasher = Some(Sha256::new());
        }
    }

    /// Bytes of the file received so far (held or let go).
    pub(super) fn len(&self) -> u64 {
        self.base.saturating_add(self.bytes.len() as u64)
    }

    /// The index in `bytes` of the file's byte `at` (past the end where `at` was let go).
    fn index(&self, at: u64) -> usize {
        at.checked_sub(self.base)
            .and_then(|i| usize::try_from(i).ok())
            .unwrap_or(usize::MAX)
    }

    /// Lets go of the bytes before the file's byte `at` (what the store has taken), unless the
    /// sink keeps the file.
    fn release(&mut self, at: u64) {
        if self.keep {
            return;
        }
        let n = self.index(at).min(self.bytes.len());
        self.bytes.drain(..n);
        self.base = self.base.saturating_add(n as u64);
    }

    pub(super) fn push(&mut self, chunk: &Uint8Array, what: &str) -> Result<()> {
        let start = self.bytes.len();
        let n = chunk.length() as usize;
        let held = self.len();
        let too_big = || {
            io(
                what,
                format!(
                    "{} bytes do not fit in this page's memory (wasm32 allows at most 4 GiB)",
                    held.saturating_add(n as u64)
                ),
            )
        };
        self.bytes.try_reserve(n).map_err(|_| too_big())?;
        self.bytes.resize(start.saturating_add(n), 0);
        let new = self.bytes.get_mut(start..).ok_or_else(too_big)?;
        chunk.copy_to(new);
        if let Some(h) = &mut self.hasher {
            h.update(&*new);
        }
        Ok(())
    }

    /// The bytes' SHA-256, when they were hashed (taken: asked once).
    pub(super) fn digest(&mut self) -> Option<[u8; 32]> {
        self.hasher.take().map(|h| h.finalize().into())
    }
}

/// A download in progress: the bytes so far, the store entry they are written to.
pub(super) struct Download<'a> {
    /// The URL or file name, for messages.
    pub(super) name: &'a str,
    pub(super) sink: Sink,
    pub(super) writer: Option<EntryWriter>,
    /// A write to the store failed (why): the download goes on, the entry is removed at the end.
    pub(super) store_failed: Option<String>,
    pub(super) progress: &'a mut dyn FnMut(u64, u64),
}

impl Download<'_> {
    /// Reads `stream` to its end into the sink, writing each whole part to the store. `Err`
    /// only for the stream (the network); a failed store write stops storing instead.
    pub(super) async fn pump(
        &mut self,
        stream: &ReadableStream,
        total: u64,
    ) -> std::result::Result<(), String> {
        let reader: ReadableStreamDefaultReader = stream.get_reader().unchecked_into();
        let mut reported = self.sink.len();
        (self.progress)(reported, total.max(reported));
        loop {
            let step = JsFuture::from(reader.read())
                .await
                .map_err(|e| js_text(&e))?;
            let done = Reflect::get(&step, &JsValue::from_str("done"))
                .ok()
                .and_then(|d| d.as_bool())
                .unwrap_or(true);
            if done {
                break;
            }
            let chunk: Uint8Array = Reflect::get(&step, &JsValue::from_str("value"))
                .ok()
                .and_then(|v| v.dyn_into().ok())
                .ok_or("the stream gave something other than bytes")?;
            self.sink
                .push(&chunk, self.name)
                .map_err(|e| e.to_string())?;
            self.write_whole_parts().await;
            if let (false, Some(why)) = (self.sink.keep, &self.store_failed) {
                // the bytes the store took are gone from memory: nothing to go on with
                let _ = reader.cancel();
                return Err(format!("the store could not keep the download: {why}"));
            }
            let loaded = self.sink.len();
            if loaded - reported >= PROGRESS_STEP {
                reported = loaded;
                (self.progress)(loaded, total.max(loaded));
            }
        }
        let loaded = self.sink.len();
        (self.progress)(loaded, total.max(loaded));
        Ok(())
    }

    pub(super) async fn write_whole_parts(&mut self) {
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        loop {
            let from = self.sink.index(w.committed());
            let Some(part) = self.sink.bytes.get(from..from.saturating_add(PART_BYTES)) else {
                break;
            };
            if part.len() < PART_BYTES {
                break;
            }
            if let Err(e) = w.write_part(part).await {
                self.writer = None;
                self.store_failed = Some(e.to_string());
                return;
            }
        }
        self.sink.release(w.committed());
    }

    /// Writes what arrived after the last whole part as a part of its own (the connection
    /// broke, or the file is complete).
    pub(super) async fn write_tail(&mut self) {
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        let from = self.sink.index(w.committed());
        let tail = self.sink.bytes.get(from..).unwrap_or_default();
        match w.write_part(tail).await {
            Ok(()) => self.sink.release(w.committed()),
            Err(e) => {
                self.writer = None;
                self.store_failed = Some(e.to_string());
            }
        }
    }

    /// Drops every byte kept (in memory and in the store) to start again from the first, the
    /// store's record naming the file now announced: `total` bytes (0: unknown) and its
    /// validators.
    pub(super) async fn restart(
        &mut self,
        total: u64,
        etag: Option<String>,
        modified: Option<String>,
    ) {
        self.sink.reset();
        if let Some(w) = self.writer.as_mut() {
            let record = StoredRecord {
                bytes: total,
                etag,
                last_modified: modified,
                ..w.record().clone()
            };
            if let Err(e) = w.restart(record).await {
                self.writer = None;
                self.store_failed = Some(e.to_string());
            }
        }
    }
}

/// Reads a stream (a File's) to its end into one buffer of `total` bytes reserved up front;
/// `what` names it in errors.
pub(crate) async fn read_all(
    stream: &ReadableStream,
    total: u64,
    what: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<u8>> {
    let mut d = Download {
        name: what,
        sink: Sink::new(true, false),
        writer: None,
        store_failed: None,
        progress,
    };
    if !d.sink.try_reserve(total) {
        return Err(io(
            what,
            format!("{total} bytes do not fit in this page's memory (wasm32 allows at most 4 GiB)"),
        ));
    }
    d.pump(stream, total)
        .await
        .map_err(|e| io(what, format!("reading failed: {e}")))?;
    Ok(d.sink.bytes)
}

impl Download<'_> {
    /// The bytes read, as a file that came from the store (`stored`: the store holds it now).
    pub(super) fn into_stored_file(self, stored: bool) -> UrlFile {
        UrlFile {
            bytes: self.sink.bytes,
            from_store: true,
            downloaded: 0,
            stored,
            cache_after: None,
            persisted: None,
            store_error: None,
        }
    }

    /// Drops a stored copy that could not be used and starts the sink (and its digest) again.
    pub(super) async fn forget_stored(&mut self, s: &OpfsStore, digest: Option<&[u8; 32]>) {
        s.remove(self.name).await;
        self.restart(0, None, None).await;
        self.sink.hasher = digest.map(|_| Sha256::new());
    }
}

/// Reads `blob` (a stored copy) to its end into `d`'s sink, its memory reserved up front (a
/// growing buffer would pass through twice the file's size, and wasm memory never shrinks).
pub(super) async fn read_stored(d: &mut Download<'_>, blob: &Blob, total: u64) -> bool {
    if !d.sink.try_reserve((blob.size() as u64).max(total)) {
        return false;
    }
    let writer = d.writer.take();
    let ok = d.pump(&blob.stream(), total).await.is_ok();
    d.writer = writer;
    ok
}

/// Bytes hashed per slice of a stored copy.
const HASH_SLICE: u64 = 16 << 20;

/// Feeds the first `upto` bytes of `blob` (a stored copy, or the parts of one kept so far) to
/// the sink's digest without keeping them, a slice at a time, reporting progress; `false` when
/// the blob could not be read or is shorter.
pub(super) async fn hash_stored(d: &mut Download<'_>, blob: &Blob, upto: u64, total: u64) -> bool {
    if (blob.size() as u64) < upto {
        return false;
    }
    let mut at = 0u64;
    let mut buf = Vec::new();
    while at < upto {
        let end = at.saturating_add(HASH_SLICE).min(upto);
        let Ok(slice) = blob.slice_with_f64_and_f64(at as f64, end as f64) else {
            return false;
        };
        let Ok(buffer) = JsFuture::from(slice.array_buffer()).await else {
            return false;
        };
        let array = Uint8Array::new(&buffer);
        let n = array.length() as usize;
        if n as u64 != end - at {
            return false;
        }
        buf.resize(n, 0);
        array.copy_to(&mut buf);
        if let Some(h) = &mut d.sink.hasher {
            h.update(&buf);
        }
        at = end;
        (d.progress)(at, total.max(at));
    }
    true
}
