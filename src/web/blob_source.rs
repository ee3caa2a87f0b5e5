//! Files a page holds as Blobs (a user's `File`s, a stored download's parts in the Origin
//! Private File System) read a byte range at a time: what a GPU load reads each layer's
//! tensors from, so that the page never holds a model's files whole.

use js_sys::Uint8Array;
use wasm_bindgen_futures::JsFuture;
use web_sys::Blob;

use super::opfs::js_text;
use crate::error::{Error, Result};
use crate::model::byte_source::{ByteSource, LocalFuture};

/// A model's files as Blobs, each with its name for messages.
pub(crate) struct BlobSource {
    files: Vec<(Blob, String)>,
}

impl BlobSource {
    /// The files, in the order a load names them.
    pub fn new(files: Vec<(Blob, String)>) -> Self {
        Self { files }
    }

    /// Each file's name and size, in order.
    pub fn names(&self) -> Vec<(String, u64)> {
        self.files
            .iter()
            .map(|(b, n)| (n.clone(), b.size() as u64))
            .collect()
    }
}

fn io(name: &str, message: String) -> Error {
    Error::Io {
        path: name.to_string(),
        message,
    }
}

impl ByteSource for BlobSource {
    fn read(&self, file: usize, range: std::ops::Range<u64>) -> LocalFuture<'_, Result<Vec<u8>>> {
        Box::pin(async move {
            let (blob, name) = self
                .files
                .get(file)
                .ok_or_else(|| Error::invalid("file", format!("no file {file} in this model")))?;
            let want = range.end.saturating_sub(range.start);
            let slice = blob
                .slice_with_f64_and_f64(range.start as f64, range.end as f64)
                .map_err(|e| io(name, js_text(&e)))?;
            let buffer = JsFuture::from(slice.array_buffer())
                .await
                .map_err(|e| io(name, format!("reading bytes {range:?}: {}", js_text(&e))))?;
            let bytes = Uint8Array::new(&buffer).to_vec();
            if bytes.len() as u64 != want {
                return Err(io(
                    name,
                    format!(
                        "bytes {range:?} were asked for and {} came: the file is shorter than \
                         its header says ({} bytes)",
                        bytes.len(),
                        blob.size()
                    ),
                ));
            }
            Ok(bytes)
        })
    }
}
