//! Model files in memory read a byte range at a time: the [`ByteSource`] the tests of loads
//! read by range use, counting the reads and remembering the ranges asked for.

use std::cell::{Cell, RefCell};
use std::ops::Range;
use std::rc::Rc;

use emberlm::model::byte_source::{ByteSource, LocalFuture};
use emberlm::{Error, Result};

/// Files in memory, read a range at a time; counts the reads and remembers the ranges.
pub struct Files {
    files: Vec<Vec<u8>>,
    /// Reads so far.
    pub reads: Cell<usize>,
    /// Ranges asked for, per file.
    pub asked: RefCell<Vec<(usize, Range<u64>)>>,
    /// What [`ByteSource::merge_up_to`] says.
    merge: u64,
}

impl Files {
    /// `files`, whose source says `merge` for [`ByteSource::merge_up_to`].
    pub fn new(files: Vec<Vec<u8>>, merge: u64) -> Rc<Self> {
        Rc::new(Self {
            files,
            reads: Cell::new(0),
            asked: RefCell::new(Vec::new()),
            merge,
        })
    }
}

impl ByteSource for Files {
    fn read(&self, file: usize, range: Range<u64>) -> LocalFuture<'_, Result<Vec<u8>>> {
        self.reads.set(self.reads.get() + 1);
        self.asked.borrow_mut().push((file, range.clone()));
        let got = self.files[file]
            .get(range.start as usize..range.end as usize)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| Error::Io {
                path: format!("file {file}"),
                message: format!("bytes {range:?} are past its end"),
            });
        Box::pin(async move { got })
    }

    fn merge_up_to(&self) -> u64 {
        self.merge
    }
}

/// The model of `files` (`(name, bytes)` each) opened by range from a [`Files`] source that
/// reads each range on its own; the source too, to count its reads.
pub fn open_ranged(
    files: &[(&str, Vec<u8>)],
) -> (Rc<Files>, Result<emberlm::format::gguf_ranged::RangedGguf>) {
    let source = Files::new(files.iter().map(|(_, b)| b.clone()).collect(), 0);
    let names: Vec<(String, u64)> = files
        .iter()
        .map(|(n, b)| (n.to_string(), b.len() as u64))
        .collect();
    let dyn_source: Rc<dyn ByteSource> = source.clone();
    let ranged = pollster::block_on(emberlm::format::gguf_ranged::RangedGguf::open(
        dyn_source, &names,
    ));
    (source, ranged)
}
