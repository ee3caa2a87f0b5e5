//! The tiled attention against one token's one head at a time (the form it replaced, kept
//! here as the reference): the same bits on fresh random inputs at awkward sizes, for prefill
//! chunks (tiles and their remainders), decode steps, windows, rings, batched steps of
//! several slots, grouped and ungrouped heads, and an encoded cache.

use super::*;
use crate::backend::cpu::test_rng::Lcg;
use crate::dtype::kv::KvKind;

/// One token's one head at a time, over the positions in order.
fn reference(q: &[f32], k: &KvRows, v: &KvRows, keys: &[KeyRange], s: AttnShape) -> Vec<f32> {
    let hd = s.head_dim;
    let group = s.group();
    let scale = s.scale();
    let mut out = vec![0.0f32; keys.len() * s.n_heads * hd];
    for (i, o) in out.chunks_mut(hd).enumerate() {
        let (t, h) = (i / s.n_heads, i % s.n_heads);
        let qh = &q[t * s.q_stride + h * hd..][..hd];
        let off = (h / group) * hd;
        let range = keys[t];
        let mut buf = vec![0.0f32; hd];
        let mut scores: Vec<f32> = (range.first..range.end)
            .map(|p| dot_f32(qh, k.span(range.row(p), off, &mut buf)) * scale)
            .collect();
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut sum = 0.0f32;
        for x in scores.iter_mut() {
            *x = crate::math::softmax_exp(*x - max);
            sum += *x;
        }
        for (pos, &p) in (range.first..range.end).zip(&scores) {
            let vr = v.span(range.row(pos), off, &mut buf);
            for (a, &b) in o.iter_mut().zip(vr) {
                *a += p * b;
            }
        }
        let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
        o.iter_mut().for_each(|a| *a *= inv);
    }
    out
}

/// A cache of `rows` random rows in `kind`.
fn cache(kind: KvKind, kv_dim: usize, rows: usize, rng: &mut Lcg) -> KvRows {
    let mut c = KvRows::new(kind, kv_dim, rows).unwrap();
    for r in 0..rows {
        let row: Vec<f32> = (0..kv_dim).map(|_| rng.f32() * 2.0).collect();
        c.write(r, &row);
    }
    c
}

struct Case {
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// Each token's keys.
    keys: Vec<KeyRange>,
    rows: usize,
    kind: KvKind,
    stacked: bool,
}

fn check(case: &Case, seed: u64) {
    let mut rng = Lcg(seed);
    let kv_dim = case.n_kv_heads * case.head_dim;
    let q_dim = case.n_heads * case.head_dim;
    let q_stride = if case.stacked {
        q_dim + 2 * kv_dim
    } else {
        q_dim
    };
    let s = AttnShape {
        n_heads: case.n_heads,
        n_kv_heads: case.n_kv_heads,
        head_dim: case.head_dim,
        q_stride,
        score_scale: 1.0,
    };
    let q: Vec<f32> = (0..case.keys.len() * q_stride).map(|_| rng.f32()).collect();
    let k = cache(case.kind, kv_dim, case.rows, &mut rng);
    let v = cache(case.kind, kv_dim, case.rows, &mut rng);
    let want = reference(&q, &k, &v, &case.keys, s);
    let mut got = vec![f32::NAN; want.len()];
    // on the thread team where there is one, so that its jobs run on several threads
    crate::backend::cpu::run(|| attention(&q, &k, &v, &case.keys, s, &mut got));
    let differ = got
        .iter()
        .zip(&want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(
        differ,
        0,
        "{differ} of {} values differ: {} heads / {} kv, head_dim {}, {} tokens, {:?}",
        want.len(),
        case.n_heads,
        case.n_kv_heads,
        case.head_dim,
        case.keys.len(),
        case.kind
    );
}

/// A prefill chunk of `n` tokens from position `start`, causal, within `window` when given.
fn chunk(start: usize, n: usize, window: Option<usize>, base: usize, ring: usize) -> Vec<KeyRange> {
    (start..start + n)
        .map(|pos| KeyRange {
            first: window.map_or(0, |w| (pos + 1).saturating_sub(w)),
            end: pos + 1,
            base,
            ring,
        })
        .collect()
}

#[test]
fn tiles_give_the_bits_of_one_head_at_a_time() {
    let mut seed = 1;
    for (n_heads, n_kv_heads, head_dim) in [(9, 3, 64), (4, 4, 24), (6, 2, 80), (3, 1, 13)] {
        for (start, n) in [(0, 1), (0, 5), (7, 17), (0, 40), (100, 33), (250, 1)] {
            for kind in [KvKind::F32, KvKind::Q8_0] {
                let case = Case {
                    n_heads,
                    n_kv_heads,
                    head_dim,
                    keys: chunk(start, n, None, 0, 0),
                    rows: start + n,
                    kind,
                    stacked: n % 2 == 1,
                };
                check(&case, seed);
                seed += 1;
            }
        }
    }
}

/// At a length where a tile of 16 would hold more than [`MAX_SCORES`] scores, tiles shrink and
/// the bits stay.
#[test]
fn long_ranges_take_smaller_tiles_with_the_same_bits() {
    let case = Case {
        n_heads: 8,
        n_kv_heads: 1,
        head_dim: 8,
        keys: chunk(20_000, 20, None, 0, 0),
        rows: 20_020,
        kind: KvKind::F32,
        stacked: false,
    };
    check(&case, 80);
}

#[test]
fn windows_rings_and_batched_slots_keep_the_bits() {
    // a local layer: a window of 24 over a ring of 40 rows, a chunk past the ring's length
    let case = Case {
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: 32,
        keys: chunk(60, 21, Some(24), 0, 40),
        rows: 40,
        kind: KvKind::F32,
        stacked: false,
    };
    check(&case, 77);
    // a batched decode step: one token of each of five slots, at different positions
    let keys = (0..5)
        .map(|slot| KeyRange {
            first: 0,
            end: 3 + slot * 7,
            base: slot * 50,
            ring: 0,
        })
        .collect();
    let case = Case {
        n_heads: 6,
        n_kv_heads: 3,
        head_dim: 16,
        keys,
        rows: 250,
        kind: KvKind::F32,
        stacked: false,
    };
    check(&case, 78);
    // two slots' prefill chunks in one step, and an empty range
    let mut keys = chunk(0, 19, None, 0, 0);
    keys.extend(chunk(5, 9, None, 100, 0));
    keys.push(KeyRange::rows(3, 3));
    let case = Case {
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 40,
        keys,
        rows: 200,
        kind: KvKind::Q8_0,
        stacked: true,
    };
    check(&case, 79);
}

#[test]
fn tokens_split_into_tiles_of_one_cache() {
    let mut keys = chunk(0, 35, None, 0, 0);
    keys.extend(chunk(0, 2, None, 64, 0));
    let tiles = token_tiles(&keys, TILE);
    assert_eq!(tiles, vec![0..16, 16..32, 32..35, 35..37]);
    assert_eq!(token_tiles(&keys, 10)[..2], [0..10, 10..20]);
}

/// Decode steps at length take the split path ([`split`]): ranges past its threshold in
/// several runs of positions, head sizes that are not a multiple of its run of values, groups
/// of one to seven query heads (its passes take four at a time), batched slots of different
/// lengths, a window over a ring, and an encoded cache.
#[test]
fn decode_steps_at_length_keep_the_bits() {
    let mut seed = 90;
    let at = split::FROM;
    for (n_heads, n_kv_heads, head_dim) in [
        (9, 3, 64),
        (8, 8, 13),
        (12, 2, 80),
        (14, 2, 24),
        (5, 1, 40),
        (4, 1, 16),
    ] {
        for (len, kind) in [
            (at, KvKind::F32),
            (at + 300, KvKind::Q8_0),
            (3 * split::POSITIONS + 1, KvKind::F32),
        ] {
            let case = Case {
                n_heads,
                n_kv_heads,
                head_dim,
                keys: chunk(len - 1, 1, None, 0, 0),
                rows: len,
                kind,
                stacked: seed % 2 == 0,
            };
            check(&case, seed);
            seed += 1;
        }
    }
    // three slots of a batched step, one short of the threshold, one at it, one past
    let keys = [at - 1, at, 2 * at + 7]
        .iter()
        .enumerate()
        .map(|(slot, &n)| KeyRange {
            first: 0,
            end: n,
            base: slot * 2000,
            ring: 0,
        })
        .collect();
    let case = Case {
        n_heads: 6,
        n_kv_heads: 2,
        head_dim: 24,
        keys,
        rows: 6000,
        kind: KvKind::F32,
        stacked: false,
    };
    check(&case, seed);
    // a local layer's window over a ring, at a position past the ring's length
    let case = Case {
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 32,
        keys: chunk(3000, 1, Some(at + 40), 0, at + 60),
        rows: at + 60,
        kind: KvKind::F32,
        stacked: false,
    };
    check(&case, seed + 1);
}
