//! One layer's cached keys or values on the CPU, in any KV-cache kind: f32 rows read in
//! place, or rows encoded as the GPU cache stores them ([`KvKind::encode_row`]: f16, or blocks
//! of 32 with an f16 scale) and decoded a head at a time as attention reads them, so a
//! quantized cache takes its kind's memory here too.

use crate::dtype::kv::{KvKind, KV_BLOCK};
use crate::error::{Error, Result};

/// One query token's keys: the key positions `first..end` of its sequence, position `p` in
/// cache row [`KeyRange::row`]: `base + p`, or `base + p mod ring` in a local layer's ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRange {
    /// First key position attended.
    pub first: usize,
    /// One past the last (the token's own position).
    pub end: usize,
    /// The cache row of the sequence's first row (its slot's).
    pub base: usize,
    /// Rows of the layer's ring (0: the cache keeps every position).
    pub ring: usize,
}

impl KeyRange {
    /// The cache rows `first..end` themselves (no ring, base 0).
    pub fn rows(first: usize, end: usize) -> Self {
        Self {
            first,
            end,
            base: 0,
            ring: 0,
        }
    }

    /// Key positions attended (`end − first`; 0 for an empty range).
    #[inline]
    pub fn len(&self) -> usize {
        self.end.saturating_sub(self.first)
    }

    /// Whether no key position is attended.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cache row of key position `p`.
    #[inline]
    pub fn row(&self, p: usize) -> usize {
        match self.ring {
            0 => self.base + p,
            r => self.base + p % r,
        }
    }
}

/// `rows` cached rows of `kv_dim` values in one kind.
#[derive(Debug, Clone)]
pub enum KvRows {
    /// f32 rows.
    F32 {
        /// Values per row.
        kv_dim: usize,
        /// The rows, `[rows, kv_dim]`.
        values: Vec<f32>,
    },
    /// Encoded rows, `[rows, kind.row_words(kv_dim)]` words.
    Encoded {
        /// How the rows are encoded (not f32).
        kind: KvKind,
        /// Values per row.
        kv_dim: usize,
        /// The rows' words.
        words: Vec<u32>,
    },
}

/// A zeroed vector of `len` elements, or an error naming the cache that does not fit.
fn zeroed<T: Clone + Default>(len: usize, bytes: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        Error::invalid(
            "context",
            format!(
                "a KV cache layer of {} MiB does not fit in memory",
                bytes >> 20
            ),
        )
    })?;
    v.resize(len, T::default());
    Ok(v)
}

impl KvRows {
    /// `rows` zeroed rows of `kv_dim` values in `kind`.
    pub fn new(kind: KvKind, kv_dim: usize, rows: usize) -> Result<Self> {
        let overflow = || Error::invalid("context", "the KV cache's size overflows");
        Ok(match kind {
            KvKind::F32 => {
                let len = rows.checked_mul(kv_dim).ok_or_else(overflow)?;
                KvRows::F32 {
                    kv_dim,
                    values: zeroed(len, len.saturating_mul(4))?,
                }
            }
            _ => {
                let len = rows
                    .checked_mul(kind.row_words(kv_dim))
                    .ok_or_else(overflow)?;
                KvRows::Encoded {
                    kind,
                    kv_dim,
                    words: zeroed(len, len.saturating_mul(4))?,
                }
            }
        })
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        match self {
            KvRows::F32 { values, .. } => values.len() as u64 * 4,
            KvRows::Encoded { words, .. } => words.len() as u64 * 4,
        }
    }

    /// The first `rows` rows as stored, `[rows, row words]` (f32 rows as their bits): what a
    /// saved conversation keeps.
    pub fn words(&self, rows: usize) -> Vec<u32> {
        match self {
            KvRows::F32 { kv_dim, values } => {
                bytemuck::cast_slice(&values[..(rows * kv_dim).min(values.len())]).to_vec()
            }
            KvRows::Encoded {
                kind,
                kv_dim,
                words,
            } => words[..(rows * kind.row_words(*kv_dim)).min(words.len())].to_vec(),
        }
    }

    /// Writes `words` (whole rows as [`KvRows::words`] gives them) over the first rows; fails
    /// when they are not whole rows or more rows than are held.
    pub fn set_words(&mut self, words: &[u32]) -> Result<()> {
        let (row, held) = match self {
            KvRows::F32 { kv_dim, values } => (*kv_dim, values.len()),
            KvRows::Encoded {
                kind,
                kv_dim,
                words,
            } => (kind.row_words(*kv_dim), words.len()),
        };
        if row == 0 || !words.len().is_multiple_of(row) || words.len() > held {
            return Err(Error::invalid(
                "kv",
                format!(
                    "{} words are not whole rows of {row} within the {held} held",
                    words.len()
                ),
            ));
        }
        match self {
            KvRows::F32 { values, .. } => {
                values[..words.len()].copy_from_slice(bytemuck::cast_slice(words));
            }
            KvRows::Encoded { words: held, .. } => held[..words.len()].copy_from_slice(words),
        }
        Ok(())
    }

    /// Stores `values` (`[kv_dim]`) as row `row`, encoded in the kind.
    pub fn write(&mut self, row: usize, values: &[f32]) {
        match self {
            KvRows::F32 { kv_dim, values: v } => {
                v[row * *kv_dim..][..*kv_dim].copy_from_slice(values);
            }
            KvRows::Encoded {
                kind,
                kv_dim,
                words,
            } => {
                let w = kind.row_words(*kv_dim);
                words[row * w..][..w].copy_from_slice(&kind.encode_row(values));
            }
        }
    }

    /// Asks the CPU to start loading values `off..off + len` of row `row` of an f32 cache (a
    /// row not in the cache, or another kind: nothing), so that a walk over rows a head's
    /// stretch at a time (strided, which the CPU's own prefetch follows poorly) finds them
    /// loaded. A hint only: no value changes.
    #[inline(always)]
    pub fn prefetch(&self, row: usize, off: usize, len: usize) {
        #[cfg(target_arch = "x86_64")]
        if let KvRows::F32 { kv_dim, values } = self {
            let start = row * kv_dim + off;
            if start + len <= values.len() {
                let p = values[start..].as_ptr().cast::<i8>();
                for line in (0..len * 4).step_by(64) {
                    // SAFETY: a prefetch of an address within `values` (checked above); SSE
                    // is part of x86-64.
                    unsafe {
                        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                            p.wrapping_add(line),
                        )
                    };
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (row, off, len);
    }

    /// Values `off..off + len` of row `row`: the f32 rows themselves, or decoded into `buf`
    /// (`[len]`).
    pub fn span<'a>(&'a self, row: usize, off: usize, buf: &'a mut [f32]) -> &'a [f32] {
        match self {
            KvRows::F32 { kv_dim, values } => &values[row * kv_dim + off..][..buf.len()],
            KvRows::Encoded {
                kind,
                kv_dim,
                words,
            } => {
                let w = kind.row_words(*kv_dim);
                decode_span(*kind, &words[row * w..][..w], *kv_dim, off, buf);
                buf
            }
        }
    }

    /// Copies rows `from..from + n` over rows `to..to + n`.
    pub fn copy_rows(&mut self, from: usize, to: usize, n: usize) {
        match self {
            KvRows::F32 { kv_dim, values } => {
                let d = *kv_dim;
                values.copy_within(from * d..(from + n) * d, to * d)
            }
            KvRows::Encoded {
                kind,
                kv_dim,
                words,
            } => {
                let w = kind.row_words(*kv_dim);
                words.copy_within(from * w..(from + n) * w, to * w);
            }
        }
    }
}

/// The rows `keys` read of `k` and `v`, decoded once for a step: with an encoded cache, f32
/// copies of the key ranges (overlapping ones merged) one after another, and each token's
/// range moved into the copies; `None` when both caches are f32 (read in place). Decoding a
/// step's rows once, rather than as every query head reads them, saves the heads of a group
/// and the tokens of a prefill chunk from decoding the same rows again.
pub fn decode_keys(
    k: &KvRows,
    v: &KvRows,
    keys: &[KeyRange],
) -> Option<(KvRows, KvRows, Vec<KeyRange>)> {
    if matches!((k, v), (KvRows::F32 { .. }, KvRows::F32 { .. })) {
        return None;
    }
    // key ranges of one sequence's cache (same base and ring) merge by position
    let mut spans: Vec<KeyRange> = keys.to_vec();
    spans.sort_unstable_by_key(|r| (r.base, r.ring, r.first, r.end));
    let mut merged: Vec<KeyRange> = Vec::with_capacity(spans.len());
    for r in spans {
        match merged.last_mut() {
            Some(last) if (last.base, last.ring) == (r.base, r.ring) && r.first <= last.end => {
                last.end = last.end.max(r.end)
            }
            _ => merged.push(r),
        }
    }
    // the source row of each copied row, and where each merged range starts in the copy
    let mut rows = Vec::new();
    let mut starts = Vec::with_capacity(merged.len());
    for m in &merged {
        starts.push(rows.len());
        rows.extend((m.first..m.end).map(|p| m.row(p)));
    }
    let moved = keys
        .iter()
        .map(|r| {
            let i = merged
                .iter()
                .position(|m| {
                    (m.base, m.ring) == (r.base, r.ring) && m.first <= r.first && r.end <= m.end
                })
                .unwrap_or(0);
            let at = starts[i] + (r.first - merged[i].first);
            KeyRange::rows(at, at + (r.end - r.first))
        })
        .collect();
    Some((copy_rows(k, &rows), copy_rows(v, &rows), moved))
}

/// Rows `rows` of `cache` as f32, one after another (decoded on the team's threads).
fn copy_rows(cache: &KvRows, rows: &[usize]) -> KvRows {
    let kv_dim = match cache {
        KvRows::F32 { kv_dim, .. } | KvRows::Encoded { kv_dim, .. } => *kv_dim,
    };
    let mut values = vec![0.0f32; rows.len() * kv_dim];
    super::for_each_chunk(&mut values, kv_dim, |i, out| match cache {
        KvRows::F32 { values: src, .. } => out.copy_from_slice(&src[rows[i] * kv_dim..][..kv_dim]),
        KvRows::Encoded { kind, words, .. } => {
            let w = kind.row_words(kv_dim);
            decode_span(*kind, &words[rows[i] * w..][..w], kv_dim, 0, out);
        }
    });
    KvRows::F32 { kv_dim, values }
}

/// Decodes values `from..from + out.len()` of one encoded row of `kv_dim` values (`words`,
/// as [`KvKind::encode_row`] lays it out) into `out`, with [`KvKind::decode_at`]'s
/// arithmetic: each block's f16 scale is read once.
pub fn decode_span(kind: KvKind, words: &[u32], kv_dim: usize, from: usize, out: &mut [f32]) {
    let sw = kind.scale_words(kv_dim);
    let per = kind.values_per_word();
    let (bits, mask) = kind.code_bits();
    let mut block = usize::MAX;
    let mut scale = 0.0f32;
    for (i, o) in out.iter_mut().enumerate() {
        let e = from + i;
        let w = words[sw + e / per];
        let code = (w >> (bits * (e % per))) & mask;
        if kind.has_scales() && e / KV_BLOCK != block {
            block = e / KV_BLOCK;
            let s = (words[block / 2] >> (16 * (block % 2))) as u16;
            scale = half::f16::from_bits(s).to_f32();
        }
        *o = match kind {
            KvKind::F32 => f32::from_bits(code),
            KvKind::F16 => half::f16::from_bits(code as u16).to_f32(),
            KvKind::Q8_0 => f32::from(code as u8 as i8) * scale,
            KvKind::Q4_0 => (code as f32 - 8.0) * scale,
            KvKind::Nf4 => crate::dtype::kv::NF4_LEVELS[code as usize] * scale,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind: a written row reads back as the reference decoder reads its encoding, at
    /// every span of an awkward width (ragged last block), and copies move whole rows.
    #[test]
    fn rows_read_back_as_the_reference_decodes_them() {
        let kv_dim = 77;
        for kind in KvKind::ALL {
            let mut rows = KvRows::new(kind, kv_dim, 5).unwrap();
            let values: Vec<Vec<f32>> = (0..5)
                .map(|r| {
                    (0..kv_dim)
                        .map(|e| ((r * 131 + e * 17) % 61) as f32 * 0.37 - 11.0)
                        .collect()
                })
                .collect();
            for (r, v) in values.iter().enumerate() {
                rows.write(r, v);
            }
            rows.copy_rows(1, 3, 2);
            for r in 0..5 {
                let src = match r {
                    3 => 1,
                    4 => 2,
                    _ => r,
                };
                let want = kind.decode_row(&kind.encode_row(&values[src]), kv_dim);
                for (off, len) in [(0, kv_dim), (5, 40), (32, 32), (64, 13), (76, 1)] {
                    let mut buf = vec![0.0; len];
                    let got = rows.span(r, off, &mut buf).to_vec();
                    let same = got
                        .iter()
                        .zip(&want[off..off + len])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{kind:?} row {r} span {off}+{len}");
                }
            }
            let row_bytes = kind.row_bytes(kv_dim);
            assert_eq!(rows.bytes(), 5 * row_bytes, "{kind:?}");
        }
    }

    /// The decoded copy of a step's key ranges (overlapping, nested, disjoint, of two
    /// sequences' slots) holds at every moved range the rows the original range reads.
    #[test]
    fn decoded_keys_hold_every_tokens_rows() {
        let (kv_dim, rows) = (40, 30);
        let mut k = KvRows::new(KvKind::Q8_0, kv_dim, rows).unwrap();
        let mut v = KvRows::new(KvKind::F32, kv_dim, rows).unwrap();
        for r in 0..rows {
            let row: Vec<f32> = (0..kv_dim).map(|e| (r * 7 + e) as f32 * 0.1).collect();
            k.write(r, &row);
            v.write(r, &row);
        }
        // a local layer's ring of 7 rows from row 10: positions p in row 10 + p mod 7
        let ring = |first, end| KeyRange {
            first,
            end,
            base: 10,
            ring: 7,
        };
        let keys = [
            KeyRange::rows(2, 9),
            KeyRange::rows(0, 5),
            KeyRange::rows(3, 4),
            KeyRange::rows(20, 26),
            KeyRange::rows(24, 30),
            ring(12, 17),
            ring(14, 19),
        ];
        let (dk, dv, moved) = decode_keys(&k, &v, &keys).unwrap();
        // merged: rows 0..9 and 20..30, and the ring's positions 12..19
        assert_eq!(dk.bytes(), (19 + 7) * kv_dim as u64 * 4);
        for (r, m) in keys.iter().zip(&moved) {
            assert_eq!(m.end - m.first, r.end - r.first);
            for (a, b) in (r.first..r.end).zip(m.first..m.end) {
                let (a, b) = (r.row(a), m.row(b));
                let (mut x, mut y) = (vec![0.0; kv_dim], vec![0.0; kv_dim]);
                assert_eq!(k.span(a, 0, &mut x), dk.span(b, 0, &mut y), "K row {a}");
                assert_eq!(v.span(a, 0, &mut x), dv.span(b, 0, &mut y), "V row {a}");
            }
        }
        let f32s = KvRows::new(KvKind::F32, kv_dim, rows).unwrap();
        assert!(decode_keys(&f32s, &f32s, &keys).is_none());
    }
}
