//! A model file's bytes, shared: read into memory, or (natively) mapped from disk. Tensors
//! borrow from them while a model loads, and the CPU backend keeps its matrices as ranges of
//! them ([`WeightBytes`]) instead of copying every weight, so a model costs its file's size
//! once, not twice (and natively, mapped pages the kernel can drop and read again).

use std::ops::{Deref, Range};
use std::sync::Arc;

/// The most bytes a WebAssembly module can address (wasm32: 4 GiB). A page holds a model's
/// files there whole, beside everything else the engine keeps.
pub const WASM32_ADDRESS_SPACE: u64 = 4 << 30;

/// Refuses files of `total` bytes in all (every part of a model whose size is known so far, as
/// `Content-Length` or `File.size` announce them) that a page's memory cannot hold: checked
/// before each file's body is read, so a model too large for the page fails at once instead of
/// after a long download.
pub fn check_fits_wasm32(total: u64, what: &str) -> crate::error::Result<()> {
    if total > WASM32_ADDRESS_SPACE {
        return Err(crate::error::Error::Limit {
            what: format!("{what}: the model's files, held whole in the page's memory"),
            limit: "wasm32 address space",
            needed: total,
            allowed: WASM32_ADDRESS_SPACE,
        });
    }
    Ok(())
}

enum Data {
    Heap(Vec<u8>),
    #[cfg(not(target_arch = "wasm32"))]
    Mapped(memmap2::Mmap),
}

/// One file's bytes, immutable and cheap to clone (the clones share them).
#[derive(Clone)]
pub struct FileBytes(Arc<Data>);

impl std::fmt::Debug for FileBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // not the bytes: a model's file is gigabytes
        f.debug_struct("FileBytes")
            .field("len", &self.len())
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

impl FileBytes {
    /// Bytes read into memory.
    pub fn heap(bytes: Vec<u8>) -> Self {
        Self(Arc::new(Data::Heap(bytes)))
    }

    /// The file at `path`, mapped read-only; read into memory instead where it cannot be
    /// mapped (a pipe, a device, an empty file, a file system that refuses the mapping).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn map(path: &std::path::Path) -> crate::error::Result<Self> {
        use std::io::Read;

        let io = |e: std::io::Error| crate::error::Error::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        let mut file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if meta.is_file() && meta.len() > 0 {
            // SAFETY: the mapping is read-only (PROT_READ) and only `&[u8]` views of it are
            // handed out, so nothing in this process writes through it. It is a shared mapping
            // of the file: another process that rewrites the file while it is mapped changes
            // what later reads see (wrong numbers, never reads out of bounds: every range was
            // checked against the mapping's fixed length), and one that truncates it ends this
            // process with SIGBUS on the next read of a lost page, as with every model loader
            // that maps its files (llama.cpp does by default). Replace a model a server is
            // using by renaming a new file over it, not by copying onto it.
            if let Ok(map) = unsafe { memmap2::Mmap::map(&file) } {
                return Ok(Self(Arc::new(Data::Mapped(map))));
            }
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io)?;
        Ok(Self::heap(bytes))
    }

    /// Whether `other` holds the same bytes (a clone of this one).
    pub fn same_as(&self, other: &FileBytes) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Whether the bytes are mapped from a file rather than held in memory.
    pub fn is_mapped(&self) -> bool {
        match &*self.0 {
            Data::Heap(_) => false,
            #[cfg(not(target_arch = "wasm32"))]
            Data::Mapped(_) => true,
        }
    }

    /// Hands the whole pages inside `range` of a mapped file back to the system (nothing for
    /// bytes held in memory): they no longer count in the process's resident memory, and a
    /// later read of them reads the file again. For a part that is kept in another form (a
    /// matrix repacked into tiles).
    pub fn release(&self, range: Range<usize>) {
        #[cfg(all(unix, not(target_arch = "wasm32")))]
        if let Data::Mapped(map) = &*self.0 {
            const PAGE: usize = 4096;
            let start = range.start.next_multiple_of(PAGE);
            let end = range.end.min(map.len()) / PAGE * PAGE;
            if end > start {
                // SAFETY: the mapping is read-only and of a file, so dropping its pages loses
                // nothing (they are read from the file again if touched); the range lies
                // inside the mapping. A refusal (an old kernel) only keeps the pages.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start,
                        end - start,
                    )
                };
            }
        }
        #[cfg(not(all(unix, not(target_arch = "wasm32"))))]
        let _ = range;
    }

    /// Where `slice` lies inside these bytes, when it is a part of them (found by address: a
    /// tensor borrowed from this file).
    pub fn range_of(&self, slice: &[u8]) -> Option<Range<usize>> {
        let base = self.as_ptr() as usize;
        let start = (slice.as_ptr() as usize).checked_sub(base)?;
        let end = start.checked_add(slice.len())?;
        (end <= self.len()).then_some(start..end)
    }
}

impl Deref for FileBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &*self.0 {
            Data::Heap(v) => v,
            #[cfg(not(target_arch = "wasm32"))]
            Data::Mapped(m) => m,
        }
    }
}

/// A tensor's bytes as a backend keeps them: a range of a shared file, or a buffer of its own
/// (a tensor made on load, such as a half of a fused matrix). A `Shared` range lies within its
/// file ([`FileBytes::range_of`] finds them so); one that did not would read as empty, which
/// the length checks of the matrices built on it refuse.
#[derive(Debug, Clone)]
pub enum WeightBytes {
    /// `range` of a file's bytes.
    Shared(FileBytes, Range<usize>),
    /// Bytes of its own.
    Owned(Vec<u8>),
}

impl WeightBytes {
    /// Whether these bytes are a file's, not a copy.
    pub fn is_shared(&self) -> bool {
        matches!(self, WeightBytes::Shared(..))
    }

    /// Whether these bytes are a mapped file's (the system can read them again at will).
    pub fn is_mapped(&self) -> bool {
        matches!(self, WeightBytes::Shared(file, _) if file.is_mapped())
    }

    /// The file and range these bytes are, when they are a file's.
    pub fn file_range(&self) -> Option<(FileBytes, Range<usize>)> {
        match self {
            WeightBytes::Shared(file, range) => Some((file.clone(), range.clone())),
            WeightBytes::Owned(_) => None,
        }
    }

    /// Gives the bytes up: a mapped file's pages in their range are handed back to the system
    /// (what reads them later reads the file again), a copy is freed.
    pub fn release(self) {
        if let WeightBytes::Shared(file, range) = &self {
            file.release(range.clone());
        }
    }
}

impl From<Vec<u8>> for WeightBytes {
    fn from(bytes: Vec<u8>) -> Self {
        WeightBytes::Owned(bytes)
    }
}

impl Deref for WeightBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            // the range was found inside these bytes (`FileBytes::range_of`)
            WeightBytes::Shared(file, range) => file.get(range.clone()).unwrap_or_default(),
            WeightBytes::Owned(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_is_found_in_its_file_and_nowhere_else() {
        let file = FileBytes::heap((0u8..64).collect());
        assert_eq!(file.range_of(&file[10..20]), Some(10..20));
        assert_eq!(file.range_of(&file[..]), Some(0..64));
        let other = vec![1u8; 8];
        assert_eq!(file.range_of(&other), None);
        let shared = WeightBytes::Shared(file.clone(), 10..20);
        assert_eq!(&shared[..], &file[10..20]);
        assert!(shared.is_shared() && !WeightBytes::Owned(other).is_shared());
    }

    #[test]
    fn files_past_the_wasm32_address_space_are_refused_with_the_numbers() {
        assert!(check_fits_wasm32(WASM32_ADDRESS_SPACE, "m.gguf").is_ok());
        let e = check_fits_wasm32(WASM32_ADDRESS_SPACE + 1, "m-00001-of-00003.gguf")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("m-00001-of-00003.gguf")
                && e.contains("4294967297")
                && e.contains("wasm32 address space"),
            "{e}"
        );
    }

    #[cfg(not(target_arch = "wasm32"))]
    #[test]
    fn a_mapped_file_reads_as_the_file() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tiny-llama-q4_1.gguf");
        let mapped = FileBytes::map(&path).unwrap();
        assert!(mapped.is_mapped());
        assert_eq!(&mapped[..], &std::fs::read(&path).unwrap()[..]);
        let missing = FileBytes::map(std::path::Path::new("no/such/file.gguf")).unwrap_err();
        assert!(
            missing.to_string().contains("no/such/file.gguf"),
            "{missing}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn what_cannot_be_mapped_is_read() {
        // a device (as a pipe or /dev/stdin would be): read, not mapped, and not an error
        let null = FileBytes::map(std::path::Path::new("/dev/null")).unwrap();
        assert!(!null.is_mapped() && null.is_empty());
        assert_eq!(format!("{null:?}"), "FileBytes { len: 0, mapped: false }");
    }
}
