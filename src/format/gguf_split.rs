//! Split GGUF sets: one model in several files, as llama.cpp's `gguf-split` writes them.
//!
//! Part `k` of `n` is named `NAME-0000k-of-0000n.gguf` and is a GGUF file of its own: its
//! header holds `split.no` (k - 1), `split.count` (n) and `split.tensors.count` (the tensors of
//! the whole set), and the infos of the tensors in its own data section. The first part also
//! holds every other metadata key (architecture, tokenizer, chat template); it may hold no
//! tensors at all. This module reads the split keys, names the parts, and puts a set in order:
//! every part present once, each agreeing with the first, no tensor in two parts.

use std::collections::HashMap;

use super::gguf::GgufHeader;
use crate::error::{Error, Result};
use crate::model::file_bytes::FileBytes;

/// The part's number in its set, from 0.
pub const SPLIT_NO: &str = "split.no";
/// How many parts the set has.
pub const SPLIT_COUNT: &str = "split.count";
/// How many tensors the whole set holds.
pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";
/// Most parts in one set (llama.cpp numbers them with five digits).
pub const MAX_PARTS: u32 = 99_999;

/// Where a file stands in a split set, from its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitInfo {
    /// The part's number, from 0 (`split.no`).
    pub no: u32,
    /// Parts in the set (`split.count`), at least 1.
    pub count: u32,
    /// Tensors in the whole set (`split.tensors.count`), when the file says.
    pub tensors: Option<u64>,
}

impl SplitInfo {
    /// The split keys of `h`: `None` for a file that is not part of a set (no `split.count`).
    pub fn of(h: &GgufHeader) -> Result<Option<SplitInfo>> {
        let file = h.file();
        let Some(count) = h.get_u64(SPLIT_COUNT)? else {
            return Ok(None);
        };
        let count = match u32::try_from(count) {
            Ok(c) if (1..=MAX_PARTS).contains(&c) => c,
            _ => {
                return Err(Error::format(
                    file,
                    format!("`{SPLIT_COUNT}` is {count}; a split set has 1 to {MAX_PARTS} parts"),
                ))
            }
        };
        let no = h.get_u64(SPLIT_NO)?.ok_or_else(|| {
            Error::format(
                file,
                format!("`{SPLIT_COUNT}` is {count} but `{SPLIT_NO}` is missing"),
            )
        })?;
        let no = match u32::try_from(no) {
            Ok(n) if n < count => n,
            _ => {
                return Err(Error::format(
                    file,
                    format!(
                        "`{SPLIT_NO}` is {no}, but the set has {count} parts (numbered from 0)"
                    ),
                ))
            }
        };
        Ok(Some(SplitInfo {
            no,
            count,
            tensors: h.get_u64(SPLIT_TENSORS_COUNT)?,
        }))
    }

    /// Whether the file is one part of several.
    pub fn is_split(&self) -> bool {
        self.count > 1
    }
}

/// A file name in the split layout: `PREFIX-0000k-of-0000n.gguf`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartName {
    /// Everything before `-0000k`.
    pub prefix: String,
    /// The part's number, from 0.
    pub no: u32,
    /// Parts in the set.
    pub count: u32,
    /// Digits in each number (5 as llama.cpp writes them; kept as found).
    pub width: usize,
}

impl PartName {
    /// Reads `name` (a file name, no folders); `None` when it is not in the split layout.
    pub fn parse(name: &str) -> Option<PartName> {
        let stem = name.strip_suffix(".gguf")?;
        let (left, count) = stem.rsplit_once("-of-")?;
        let (prefix, no) = left.rsplit_once('-')?;
        let digits = |s: &str| s.len() >= 5 && s.bytes().all(|b| b.is_ascii_digit());
        if prefix.is_empty() || !digits(no) || !digits(count) || no.len() != count.len() {
            return None;
        }
        let width = no.len();
        let (no, count): (u32, u32) = (no.parse().ok()?, count.parse().ok()?);
        if no == 0 || no > count || count > MAX_PARTS {
            return None;
        }
        Some(PartName {
            prefix: prefix.to_string(),
            no: no.saturating_sub(1),
            count,
            width,
        })
    }

    /// The file name of part `no` (from 0) of the same set.
    pub fn sibling(&self, no: u32) -> String {
        let width = self.width;
        format!(
            "{}-{:0width$}-of-{:0width$}.gguf",
            self.prefix,
            u64::from(no) + 1,
            self.count
        )
    }
}

/// The URLs of every part of the set whose first part is at `url` (the last path segment
/// renamed; query and fragment kept), or `None` when that segment is not the first part of a
/// set of two or more in the split layout.
pub fn part_urls(url: &str) -> Option<Vec<String>> {
    let path_end = url.find(['?', '#']).unwrap_or(url.len());
    let (path, rest) = url.split_at(path_end);
    let segment_start = path.rfind('/').map_or(0, |i| i.saturating_add(1));
    let (dir, segment) = path.split_at(segment_start);
    let name = PartName::parse(segment)?;
    if name.no != 0 || name.count < 2 {
        return None;
    }
    Some(
        (0..name.count)
            .map(|k| format!("{dir}{}{rest}", name.sibling(k)))
            .collect(),
    )
}

/// One file of a model: its name for messages, its bytes and its parsed header.
#[derive(Debug)]
pub struct GgufPart {
    /// The file's name or path, as errors name it.
    pub name: String,
    /// The whole file.
    pub bytes: FileBytes,
    /// Its header.
    pub header: GgufHeader,
}

impl GgufPart {
    /// Parses the header of a whole file held in memory.
    pub fn parse(bytes: Vec<u8>, name: &str) -> Result<Self> {
        Self::new(FileBytes::heap(bytes), name)
    }

    /// Parses the header of a whole file (held in memory or mapped).
    pub fn new(bytes: FileBytes, name: &str) -> Result<Self> {
        let header = GgufHeader::parse(&bytes, name)?;
        Ok(Self {
            name: name.to_string(),
            bytes,
            header,
        })
    }
}

/// The message for a part of a set given alone.
fn alone(info: &SplitInfo, name: &str) -> String {
    let first = std::path::Path::new(name)
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(PartName::parse)
        .map(|p| format!(" (the first is `{}`)", p.sibling(0)))
        .unwrap_or_default();
    format!(
        "part {} of a {}-part split GGUF set, given alone: every part is needed{first}; \
         natively, open the first part (the others are read from beside it); in the page, \
         give the first part's URL, a list of every part's URL, or every part's File",
        info.no.saturating_add(1),
        info.count
    )
}

/// Puts the files of one model in order and checks them as a set: one file that is not part
/// of a larger set, or every part of one split set exactly once (in any order), each agreeing
/// with the first on the part count and the tensor count, no tensor in two parts.
pub fn order_parts(parts: Vec<GgufPart>) -> Result<Vec<GgufPart>> {
    let Some(first) = parts.first() else {
        return Err(Error::invalid("source", "no model file was given"));
    };
    if parts.len() == 1 {
        if let Some(info) = SplitInfo::of(&first.header)?.filter(SplitInfo::is_split) {
            return Err(Error::format(&first.name, alone(&info, &first.name)));
        }
        return Ok(parts);
    }
    let given = parts.len();
    let mut numbered: Vec<(SplitInfo, GgufPart)> = Vec::with_capacity(given);
    for part in parts {
        let info = SplitInfo::of(&part.header)?.ok_or_else(|| {
            Error::format(
                &part.name,
                format!(
                    "not a part of a split GGUF set (no `{SPLIT_COUNT}`), but it was given with \
                     {} other file(s) as one model",
                    given.saturating_sub(1)
                ),
            )
        })?;
        numbered.push((info, part));
    }
    numbered.sort_by_key(|(info, _)| info.no);
    let (lead, lead_part) = &numbered[0];
    let count = lead.count;
    for (info, part) in &numbered {
        if info.count != count {
            return Err(Error::format(
                &part.name,
                format!(
                    "`{SPLIT_COUNT}` is {}, but `{}` says {count}: the files are from different sets",
                    info.count, lead_part.name
                ),
            ));
        }
        if info.tensors != lead.tensors {
            let said = |t: Option<u64>| t.map_or_else(|| "missing".to_string(), |n| n.to_string());
            return Err(Error::format(
                &part.name,
                format!(
                    "`{SPLIT_TENSORS_COUNT}` is {}, but `{}` says {}: the files are from \
                     different sets",
                    said(info.tensors),
                    lead_part.name,
                    said(lead.tensors)
                ),
            ));
        }
    }
    for pair in numbered.windows(2) {
        if pair[0].0.no == pair[1].0.no {
            return Err(Error::format(
                &pair[1].1.name,
                format!(
                    "part {} of {count} was given twice (also as `{}`)",
                    pair[1].0.no.saturating_add(1),
                    pair[0].1.name
                ),
            ));
        }
    }
    if u64::from(count) != given as u64 {
        let missing: Vec<String> = (0..count)
            .filter(|k| !numbered.iter().any(|(info, _)| info.no == *k))
            .take(8)
            .map(|k| k.saturating_add(1).to_string())
            .collect();
        return Err(Error::format(
            &lead_part.name,
            format!(
                "a split GGUF set of {count} parts, of which {given} were given; missing: part {}",
                missing.join(", ")
            ),
        ));
    }
    let mut seen: HashMap<&str, &str> = HashMap::new();
    let mut total = 0u64;
    for (_, part) in &numbered {
        for t in part.header.tensors() {
            if let Some(other) = seen.insert(&t.name, &part.name) {
                return Err(Error::format(
                    &part.name,
                    format!("tensor `{}` is also in `{other}`", t.name),
                ));
            }
        }
        total = total.saturating_add(part.header.tensors().len() as u64);
    }
    if let Some(expected) = lead.tensors {
        if expected != total {
            return Err(Error::format(
                &lead_part.name,
                format!(
                    "`{SPLIT_TENSORS_COUNT}` is {expected}, but the {count} parts hold {total} \
                     tensors"
                ),
            ));
        }
    }
    Ok(numbered.into_iter().map(|(_, part)| part).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_follow_llama_cpp() {
        let p = PartName::parse("Llama-3.2-1B-Q4_0-00002-of-00003.gguf").unwrap();
        assert_eq!(p.prefix, "Llama-3.2-1B-Q4_0");
        assert_eq!((p.no, p.count, p.width), (1, 3, 5));
        assert_eq!(p.sibling(0), "Llama-3.2-1B-Q4_0-00001-of-00003.gguf");
        assert_eq!(p.sibling(2), "Llama-3.2-1B-Q4_0-00003-of-00003.gguf");
        let wide = PartName::parse("m-000001-of-000012.gguf").unwrap();
        assert_eq!(wide.sibling(11), "m-000012-of-000012.gguf");
        for bad in [
            "model.gguf",
            "m-00001-of-00003.bin",
            "m-1-of-3.gguf",
            "m-00000-of-00003.gguf",
            "m-00004-of-00003.gguf",
            "m-0001-of-00003.gguf",
            "-00001-of-00003.gguf",
            "m-0000x-of-00003.gguf",
        ] {
            assert_eq!(PartName::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn urls_of_a_set_keep_the_folder_and_the_query() {
        assert_eq!(
            part_urls("https://h.example/a/m-00001-of-00002.gguf?download=true#x").unwrap(),
            vec![
                "https://h.example/a/m-00001-of-00002.gguf?download=true#x",
                "https://h.example/a/m-00002-of-00002.gguf?download=true#x",
            ]
        );
        assert_eq!(
            part_urls("m-00001-of-00003.gguf").unwrap()[2],
            "m-00003-of-00003.gguf"
        );
        // not the first part, a set of one, not the layout: nothing derived
        for url in [
            "https://h/m-00002-of-00003.gguf",
            "https://h/m-00001-of-00001.gguf",
            "https://h/m.gguf",
            "https://h/m-00001-of-00003.gguf/",
        ] {
            assert_eq!(part_urls(url), None, "{url}");
        }
    }
}
