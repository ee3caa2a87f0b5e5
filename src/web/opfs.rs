//! A store of downloaded model files in the Origin Private File System: one folder per store
//! (`emberlm/<store>/`), one folder per URL in it, holding the file's record and its bytes in
//! numbered parts (the layout is [`crate::store`]'s). Parts are written whole and never
//! rewritten, so a page closed mid-download keeps every part it finished.

use js_sys::{Array, AsyncIterator, Promise, Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{
    Blob, File, FileSystemDirectoryHandle, FileSystemFileHandle, FileSystemGetDirectoryOptions,
    FileSystemGetFileOptions, FileSystemRemoveOptions, FileSystemWritableFileStream,
    StorageManager,
};

use crate::error::{Error, Result};
use crate::store::{self, StoredRecord, RECORD_FILE};

/// The message of a JavaScript exception.
pub(crate) fn js_text(value: &JsValue) -> String {
    value
        .dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()))
        .or_else(|| value.as_string())
        .unwrap_or_else(|| format!("{value:?}"))
}

async fn wait(promise: Promise) -> std::result::Result<JsValue, JsValue> {
    JsFuture::from(promise).await
}

/// `navigator.storage` of the page or worker, when there is one.
pub(crate) fn storage_manager() -> Option<StorageManager> {
    let navigator = Reflect::get(&js_sys::global(), &JsValue::from_str("navigator")).ok()?;
    Reflect::get(&navigator, &JsValue::from_str("storage"))
        .ok()?
        .dyn_into()
        .ok()
}

/// The origin's storage quota and usage in bytes (`navigator.storage.estimate()`), when the
/// browser tells.
pub(crate) async fn estimate() -> Option<(u64, u64)> {
    let manager = storage_manager()?;
    let e = wait(manager.estimate().ok()?).await.ok()?;
    let number = |key: &str| {
        Reflect::get(&e, &JsValue::from_str(key))
            .ok()
            .and_then(|v| v.as_f64())
    };
    Some((
        number("quota")? as u64,
        number("usage").unwrap_or(0.0) as u64,
    ))
}

/// Asks the browser to keep this origin's storage under pressure
/// (`navigator.storage.persist()`; windows only) without waiting for the answer: Firefox asks
/// the user, and an unanswered prompt (or a headless browser) never settles the promise. The
/// question, for [`persist_answer`]; `None` where it cannot be asked (a worker).
pub(crate) fn ask_persist() -> Option<Promise> {
    let manager = storage_manager()?;
    let has = Reflect::get(&manager, &JsValue::from_str("persist"))
        .ok()
        .is_some_and(|f| f.is_function());
    if !has {
        return None;
    }
    manager.persist().ok()
}

/// The answer to [`ask_persist`]'s question if it came, else whether the storage is kept
/// under pressure now (`navigator.storage.persisted()`, which never asks the user); `None`
/// where nothing was asked.
pub(crate) async fn persist_answer(asked: Option<Promise>) -> Option<bool> {
    let asked = asked?;
    // A promise already settled wins a race against one resolved now; a pending one loses.
    let pending = JsValue::from_str("pending");
    let race = Promise::race(&Array::of2(&asked, &Promise::resolve(&pending)));
    match wait(race).await {
        Ok(answer) => {
            if let Some(answer) = answer.as_bool() {
                return Some(answer);
            }
        }
        Err(_) => return None,
    }
    let manager = storage_manager()?;
    wait(manager.persisted().ok()?).await.ok()?.as_bool()
}

fn io(path: &str, e: &JsValue) -> Error {
    Error::Io {
        path: path.to_string(),
        message: js_text(e),
    }
}

async fn folder(
    parent: &FileSystemDirectoryHandle,
    name: &str,
    create: bool,
) -> std::result::Result<FileSystemDirectoryHandle, JsValue> {
    let options = FileSystemGetDirectoryOptions::new();
    options.set_create(create);
    wait(parent.get_directory_handle_with_options(name, &options))
        .await?
        .dyn_into()
        .map_err(|_| JsValue::from_str("not a folder"))
}

async fn remove(dir: &FileSystemDirectoryHandle, name: &str) -> std::result::Result<(), JsValue> {
    let options = FileSystemRemoveOptions::new();
    options.set_recursive(true);
    wait(dir.remove_entry_with_options(name, &options))
        .await
        .map(|_| ())
}

/// Every `(name, handle)` of a folder.
async fn children(
    dir: &FileSystemDirectoryHandle,
) -> std::result::Result<Vec<(String, JsValue)>, JsValue> {
    let entries: AsyncIterator = dir.entries();
    let mut out = Vec::new();
    loop {
        let step = wait(entries.next()?).await?;
        if Reflect::get(&step, &JsValue::from_str("done"))?
            .as_bool()
            .unwrap_or(true)
        {
            return Ok(out);
        }
        let pair: Array = Reflect::get(&step, &JsValue::from_str("value"))?.dyn_into()?;
        if let Some(name) = pair.get(0).as_string() {
            out.push((name, pair.get(1)));
        }
    }
}

/// Writes `bytes` as the whole content of `name` in `dir` (committed when this returns).
async fn write_file(
    dir: &FileSystemDirectoryHandle,
    name: &str,
    bytes: &[u8],
) -> std::result::Result<(), JsValue> {
    let options = FileSystemGetFileOptions::new();
    options.set_create(true);
    let handle: FileSystemFileHandle = wait(dir.get_file_handle_with_options(name, &options))
        .await?
        .dyn_into()?;
    let writable: FileSystemWritableFileStream =
        wait(handle.create_writable()).await?.dyn_into()?;
    // a copy owned by JavaScript: the write may run after wasm memory has grown
    let copy = Uint8Array::from(bytes);
    if let Err(e) = wait(writable.write_with_js_u8_array(&copy)?).await {
        let _ = wait(writable.abort()).await;
        return Err(e);
    }
    wait(writable.close()).await.map(|_| ())
}

/// One store: the folder `emberlm/<store>` of the origin's private file system.
pub(crate) struct OpfsStore {
    dir: FileSystemDirectoryHandle,
    name: String,
}

/// A URL's entry as found in a store.
pub(crate) struct StoredEntry {
    /// Its record; `None` when missing or unreadable (the entry is then of no use).
    pub record: Option<StoredRecord>,
    /// Its parts in order, while they are numbered without a gap.
    pub parts: Vec<File>,
    /// The parts' bytes in all.
    pub stored: u64,
    /// Whether some file in the folder is not a part in sequence (a gap, a stray file).
    pub gaps: bool,
}

impl StoredEntry {
    /// The stored bytes as one Blob (the parts in order; nothing is read yet).
    pub fn blob(&self) -> Result<Blob> {
        let list: Array = self.parts.iter().collect();
        Blob::new_with_blob_sequence(&list).map_err(|e| io("stored parts", &e))
    }

    /// Whether the entry holds the whole file its record names.
    pub fn is_complete(&self) -> bool {
        !self.gaps
            && self
                .record
                .as_ref()
                .is_some_and(|r| r.complete && r.bytes == self.stored)
    }
}

impl OpfsStore {
    /// Opens the store called `name`, creating it when `create`. `Ok(None)` when this browser
    /// has no private file system here, or the store does not exist and `create` is false.
    pub async fn open(name: &str, create: bool) -> Result<Option<Self>> {
        let Some(manager) = storage_manager() else {
            return Ok(None);
        };
        let has = Reflect::get(&manager, &JsValue::from_str("getDirectory"))
            .ok()
            .is_some_and(|f| f.is_function());
        if !has {
            return Ok(None);
        }
        // refused in some private windows: then there is no private file system here
        let Ok(root) = wait(manager.get_directory()).await else {
            return Ok(None);
        };
        let Ok(root) = root.dyn_into::<FileSystemDirectoryHandle>() else {
            return Ok(None);
        };
        let label = format!("{}/{}", store::ROOT_FOLDER, store::folder_name(name));
        let top = match folder(&root, store::ROOT_FOLDER, create).await {
            Ok(d) => d,
            Err(_) if !create => return Ok(None),
            Err(e) => return Err(io(&label, &e)),
        };
        match folder(&top, &store::folder_name(name), create).await {
            Ok(dir) => Ok(Some(Self {
                dir,
                name: name.to_string(),
            })),
            Err(_) if !create => Ok(None),
            Err(e) => Err(io(&label, &e)),
        }
    }

    /// The store's name, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the store holds for `url`, when it holds anything.
    pub async fn entry(&self, url: &str) -> Result<Option<StoredEntry>> {
        let Ok(dir) = folder(&self.dir, &store::entry_name(url), false).await else {
            return Ok(None);
        };
        read_entry(&dir).await.map(Some)
    }

    /// Starts (or starts again) `record.url`'s entry: every part it had is removed and the
    /// record written. Resuming an entry instead keeps its parts ([`OpfsStore::resume`]).
    pub async fn begin(&self, record: StoredRecord) -> Result<EntryWriter> {
        let name = store::entry_name(&record.url);
        let _ = remove(&self.dir, &name).await;
        let dir = folder(&self.dir, &name, true)
            .await
            .map_err(|e| io(&self.label(&record.url), &e))?;
        let writer = EntryWriter {
            dir,
            next: 0,
            committed: 0,
            record,
            label: String::new(),
        };
        let label = self.label(&writer.record.url);
        let writer = EntryWriter { label, ..writer };
        writer.write_record().await?;
        Ok(writer)
    }

    /// Continues writing an entry found with `parts` parts of `stored` bytes.
    pub async fn resume(
        &self,
        record: StoredRecord,
        parts: usize,
        stored: u64,
    ) -> Result<EntryWriter> {
        let dir = folder(&self.dir, &store::entry_name(&record.url), true)
            .await
            .map_err(|e| io(&self.label(&record.url), &e))?;
        Ok(EntryWriter {
            dir,
            next: parts,
            committed: stored,
            label: self.label(&record.url),
            record,
        })
    }

    /// Removes `url`'s entry; whether there was one.
    pub async fn remove(&self, url: &str) -> bool {
        remove(&self.dir, &store::entry_name(url)).await.is_ok()
    }

    /// Every entry with a readable record: its record and the bytes stored so far.
    pub async fn list(&self) -> Result<Vec<(StoredRecord, u64)>> {
        let all = children(&self.dir)
            .await
            .map_err(|e| io(&self.label(""), &e))?;
        let mut out = Vec::new();
        for (_, handle) in all {
            let Ok(dir) = handle.dyn_into::<FileSystemDirectoryHandle>() else {
                continue;
            };
            if let Ok(entry) = read_entry(&dir).await {
                if let Some(record) = entry.record {
                    out.push((record, entry.stored));
                }
            }
        }
        out.sort_by(|a, b| a.0.url.cmp(&b.0.url));
        Ok(out)
    }

    fn label(&self, url: &str) -> String {
        format!("store `{}` (private file system) entry of {url}", self.name)
    }
}

async fn read_entry(dir: &FileSystemDirectoryHandle) -> Result<StoredEntry> {
    let all = children(dir).await.map_err(|e| io("a stored entry", &e))?;
    let mut record = None;
    let mut numbered: Vec<(usize, FileSystemFileHandle)> = Vec::new();
    let mut gaps = false;
    for (name, handle) in all {
        let Ok(handle) = handle.dyn_into::<FileSystemFileHandle>() else {
            gaps = true;
            continue;
        };
        if name == RECORD_FILE {
            record = read_record(&handle).await;
        } else if let Some(i) = store::part_index(&name) {
            numbered.push((i, handle));
        } else {
            gaps = true;
        }
    }
    numbered.sort_by_key(|(i, _)| *i);
    let mut parts = Vec::with_capacity(numbered.len());
    let mut stored = 0u64;
    for (k, (i, handle)) in numbered.into_iter().enumerate() {
        if i != k {
            gaps = true;
            break;
        }
        let Ok(file) = wait(handle.get_file())
            .await
            .and_then(|f| f.dyn_into::<File>())
        else {
            gaps = true;
            break;
        };
        stored = stored.saturating_add(file.size() as u64);
        parts.push(file);
    }
    Ok(StoredEntry {
        record,
        parts,
        stored,
        gaps,
    })
}

async fn read_record(handle: &FileSystemFileHandle) -> Option<StoredRecord> {
    let file: File = wait(handle.get_file()).await.ok()?.dyn_into().ok()?;
    let text = wait(file.text()).await.ok()?.as_string()?;
    StoredRecord::parse(text.as_bytes(), RECORD_FILE).ok()
}

/// Writes one entry's parts as a download streams in.
pub(crate) struct EntryWriter {
    dir: FileSystemDirectoryHandle,
    next: usize,
    committed: u64,
    record: StoredRecord,
    label: String,
}

impl EntryWriter {
    /// Bytes of the file written so far (the parts' sum).
    pub fn committed(&self) -> u64 {
        self.committed
    }

    /// The entry's record as written last.
    pub fn record(&self) -> &StoredRecord {
        &self.record
    }

    /// Writes `bytes` (the file's bytes from [`EntryWriter::committed`] on) as the next part.
    pub async fn write_part(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        write_file(&self.dir, &store::part_name(self.next), bytes)
            .await
            .map_err(|e| io(&self.label, &e))?;
        self.next = self.next.saturating_add(1);
        self.committed = self.committed.saturating_add(bytes.len() as u64);
        Ok(())
    }

    /// Removes every part (the download starts again from its first byte), keeping the record
    /// `record`.
    pub async fn restart(&mut self, record: StoredRecord) -> Result<()> {
        for i in 0..self.next {
            let _ = remove(&self.dir, &store::part_name(i)).await;
        }
        self.next = 0;
        self.committed = 0;
        self.record = record;
        self.write_record().await
    }

    /// Marks the entry complete at `bytes` bytes.
    pub async fn finish(&mut self, bytes: u64) -> Result<()> {
        self.record.bytes = bytes;
        self.record.complete = true;
        self.write_record().await
    }

    async fn write_record(&self) -> Result<()> {
        write_file(&self.dir, RECORD_FILE, self.record.to_json().as_bytes())
            .await
            .map_err(|e| io(&self.label, &e))
    }
}
