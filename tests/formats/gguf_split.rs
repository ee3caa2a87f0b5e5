//! Split GGUF sets (llama.cpp's `NAME-0000k-of-0000n.gguf` layout), as gguf-py's writer makes
//! them (`tests/fixtures/split/`, written by `tools/make_split_fixture.py` from
//! `tiny-llama-q4_1.gguf`): opened from the first part's path or given as every part's bytes in
//! any order, a set is the whole file, tensor for tensor; a missing, repeated, foreign or lone
//! part is an error that names it.

#![cfg(not(target_arch = "wasm32"))]

use std::path::{Path, PathBuf};

use crate::common::gguf_meta;
use emberlm::format::gguf::GgufValue;
use emberlm::format::gguf_split::SPLIT_TENSORS_COUNT;
use emberlm::loader::ModelFiles;

const WHOLE: &str = "tests/fixtures/tiny-llama-q4_1.gguf";
/// Three parts, at most 8 tensors each.
const SET: &str = "tests/fixtures/split/tiny-llama-q4_1";
/// Three parts, the first with metadata only.
const SMALL_FIRST: &str = "tests/fixtures/split/tiny-llama-q4_1-small-first";

fn part_path(set: &str, k: usize) -> PathBuf {
    PathBuf::from(format!("{set}-{k:05}-of-00003.gguf"))
}

fn part(set: &str, k: usize) -> (Vec<u8>, String) {
    let path = part_path(set, k);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (bytes, path.display().to_string())
}

/// A folder of its own under the system's temporary folder, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("emberlm-split-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch folder");
        Self(dir)
    }

    fn copy(&self, from: &Path, name: &str) -> PathBuf {
        let to = self.0.join(name);
        std::fs::copy(from, &to).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
        to
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Configuration, every tensor (name, shape, type, bytes), the tokenizer's ids for a text and
/// the chat template of `files`, equal to the whole file's.
fn assert_same_model(files: &ModelFiles, what: &str) {
    let whole = ModelFiles::open(Path::new(WHOLE)).expect("the whole file");
    let (a, b) = (whole.weights().unwrap(), files.weights().unwrap());
    assert_eq!(
        format!("{:?}", a.config),
        format!("{:?}", b.config),
        "{what}"
    );
    assert_eq!(a.tensors.len(), b.tensors.len(), "{what}");
    for ((name_a, ta), (name_b, tb)) in a.tensors.iter().zip(&b.tensors) {
        assert_eq!(name_a, name_b, "{what}");
        assert_eq!(
            (&ta.shape, ta.dtype, &ta.data),
            (&tb.shape, tb.dtype, &tb.data),
            "{what}: tensor `{name_a}`"
        );
    }
    let (ta, tb) = (whole.tokenizer().unwrap(), files.tokenizer().unwrap());
    let text = "The software is provided \"as is\", without warranty.";
    assert_eq!(
        ta.encode(text, true, None).unwrap(),
        tb.encode(text, true, None).unwrap(),
        "{what}"
    );
    assert_eq!(
        whole.chat_template(&ta).unwrap().is_some(),
        files.chat_template(&tb).unwrap().is_some(),
        "{what}"
    );
}

#[test]
fn a_set_opened_from_its_first_part_is_the_whole_file() {
    for set in [SET, SMALL_FIRST] {
        let files = ModelFiles::open(&part_path(set, 1)).unwrap_or_else(|e| panic!("{set}: {e}"));
        assert_eq!(files.file_count(), 3, "{set}");
        assert!(
            files.name().ends_with("-00001-of-00003.gguf"),
            "{}",
            files.name()
        );
        assert_same_model(&files, set);
    }
    // the small-first set's first part holds metadata alone
    let (bytes, name) = part(SMALL_FIRST, 1);
    let header = emberlm::format::gguf::GgufHeader::parse(&bytes, &name).unwrap();
    assert!(header.tensors().is_empty(), "{name}");
}

#[test]
fn parts_given_as_bytes_in_any_order_are_the_whole_file() {
    for order in [[1, 2, 3], [3, 1, 2], [2, 3, 1]] {
        let files = ModelFiles::from_parts(order.iter().map(|&k| part(SET, k)).collect())
            .unwrap_or_else(|e| panic!("{order:?}: {e}"));
        assert_eq!(files.file_count(), 3);
        assert!(
            files.name().ends_with("-00001-of-00003.gguf"),
            "{}",
            files.name()
        );
        assert_same_model(&files, &format!("{order:?}"));
    }
    // a single file through the same door
    let whole = std::fs::read(WHOLE).unwrap();
    let files = ModelFiles::from_parts(vec![(whole, WHOLE.to_string())]).unwrap();
    assert_eq!(files.file_count(), 1);
}

fn error_of(result: emberlm::Result<ModelFiles>) -> String {
    match result {
        Ok(files) => panic!("expected an error, opened {}", files.name()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_later_part_or_a_first_part_alone_names_what_is_needed() {
    let e = error_of(ModelFiles::open(&part_path(SET, 2)));
    assert!(
        e.contains("part 2 of a 3-part split GGUF set")
            && e.contains("`tiny-llama-q4_1-00001-of-00003.gguf`"),
        "{e}"
    );
    let (bytes, name) = part(SET, 1);
    let e = error_of(ModelFiles::from_bytes(bytes, &name));
    assert!(
        e.contains("part 1 of a 3-part") && e.contains("every part is needed"),
        "{e}"
    );
}

#[test]
fn a_missing_part_on_disk_is_named_by_its_path() {
    let dir = Scratch::new("missing");
    let first = dir.copy(&part_path(SET, 1), "m-00001-of-00003.gguf");
    dir.copy(&part_path(SET, 2), "m-00002-of-00003.gguf");
    let e = error_of(ModelFiles::open(&first));
    assert!(
        e.contains("m-00003-of-00003.gguf") && e.contains("part 3 of the 3-part split set"),
        "{e}"
    );
    // a first part renamed out of the layout cannot find the others
    let renamed = dir.copy(&part_path(SET, 1), "model.gguf");
    let e = error_of(ModelFiles::open(&renamed));
    assert!(e.contains("does not end in `-00001-of-00003.gguf`"), "{e}");
    // with the third part beside them, the same folder opens
    dir.copy(&part_path(SET, 3), "m-00003-of-00003.gguf");
    assert_same_model(&ModelFiles::open(&first).unwrap(), "renamed set");
}

#[test]
fn a_set_with_a_part_missing_repeated_or_foreign_is_refused_by_name() {
    let e = error_of(ModelFiles::from_parts(vec![part(SET, 1), part(SET, 2)]));
    assert!(e.contains("of which 2 were given; missing: part 3"), "{e}");

    let e = error_of(ModelFiles::from_parts(vec![
        part(SET, 1),
        part(SET, 2),
        part(SET, 2),
    ]));
    assert!(e.contains("part 2 of 3 was given twice"), "{e}");

    // a part of the other set holds tensors this set's first part holds too
    let e = error_of(ModelFiles::from_parts(vec![
        part(SET, 1),
        part(SMALL_FIRST, 2),
        part(SET, 3),
    ]));
    assert!(
        e.contains("small-first-00002-of-00003.gguf") && e.contains("is also in"),
        "{e}"
    );

    let whole = std::fs::read(WHOLE).unwrap();
    let e = error_of(ModelFiles::from_parts(vec![
        part(SET, 1),
        (whole, "whole.gguf".into()),
    ]));
    assert!(
        e.contains("whole.gguf: not a part of a split GGUF set"),
        "{e}"
    );

    // a part that counts the set's tensors differently
    let (bytes, name) = part(SET, 3);
    let path = Path::new(&name);
    let mut metadata = gguf_meta::read(path);
    gguf_meta::set(&mut metadata, SPLIT_TENSORS_COUNT, GgufValue::I32(22));
    let altered = gguf_meta::write_with_tensors(&metadata, &gguf_meta::read_tensors(path));
    assert_ne!(altered, bytes);
    let e = error_of(ModelFiles::from_parts(vec![
        part(SET, 1),
        part(SET, 2),
        (altered, "altered.gguf".into()),
    ]));
    assert!(
        e.contains("altered.gguf") && e.contains("different sets"),
        "{e}"
    );

    // every part saying 22 tensors where the three hold 21
    let mut parts = Vec::new();
    for k in 1..=3 {
        let path = part_path(SET, k);
        let mut metadata = gguf_meta::read(&path);
        gguf_meta::set(&mut metadata, SPLIT_TENSORS_COUNT, GgufValue::I32(22));
        let bytes = gguf_meta::write_with_tensors(&metadata, &gguf_meta::read_tensors(&path));
        parts.push((bytes, format!("p{k}.gguf")));
    }
    let e = error_of(ModelFiles::from_parts(parts));
    assert!(e.contains("is 22, but the 3 parts hold 21 tensors"), "{e}");

    let e = error_of(ModelFiles::from_parts(Vec::new()));
    assert!(e.contains("no model file was given"), "{e}");
}

/// The byte offset of GGUF string `s` (its u64 length, then its bytes) in `bytes`.
fn find_gguf_string(bytes: &[u8], s: &str) -> usize {
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(s.as_bytes());
    let found: Vec<usize> = bytes
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle.as_slice())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(found.len(), 1, "`{s}` occurs {} times", found.len());
    found[0]
}

#[test]
fn a_tensor_error_names_the_part_that_holds_it() {
    let files = ModelFiles::from_parts(vec![part(SET, 1), part(SET, 2), part(SET, 3)]).unwrap();
    let weights = files.weights().unwrap();
    let third = "tiny-llama-q4_1-00003-of-00003.gguf";
    // a matrix of the third part, with unequal sides
    let (name, shape) = weights
        .tensors
        .iter()
        .find(|(n, t)| {
            weights.file_of(n).ends_with(third) && t.shape.len() == 2 && t.shape[0] != t.shape[1]
        })
        .map(|(n, t)| (n.clone(), t.shape.clone()))
        .expect("a matrix in part 3");
    assert!(weights
        .file_of("token_embd.weight")
        .ends_with("00001-of-00003.gguf"));
    // a tensor in no part is looked for in all of them
    let e = weights
        .tensor("blk.9.nothing.weight")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("00001-of-00003.gguf (and the 2 other part(s) of its set)")
            && e.contains("missing tensor `blk.9.nothing.weight`"),
        "{e}"
    );
    drop(weights);
    // the matrix's two dimensions swapped in part 3's header: the same bytes, the wrong shape
    let (mut bytes, path) = part(SET, 3);
    let dims = find_gguf_string(&bytes, &name) + 8 + name.len();
    assert_eq!(
        bytes[dims..dims + 4],
        2u32.to_le_bytes(),
        "{name} has two dimensions"
    );
    let (a, b) = (dims + 4, dims + 12);
    let (first, second) = (bytes[a..a + 8].to_vec(), bytes[b..b + 8].to_vec());
    bytes[a..a + 8].copy_from_slice(&second);
    bytes[b..b + 8].copy_from_slice(&first);
    let e = ModelFiles::from_parts(vec![part(SET, 1), part(SET, 2), (bytes, path)])
        .and_then(|f| f.weights().map(|_| ()))
        .expect_err("a misshapen tensor")
        .to_string();
    let swapped = [shape[1], shape[0]];
    assert!(
        e.contains(third)
            && !e.contains("00001-of-00003")
            && e.contains(&format!("tensor `{name}` has shape {swapped:?}")),
        "{e}"
    );
}
