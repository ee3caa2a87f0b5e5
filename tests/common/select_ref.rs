//! A CPU reference of the candidate selection kernel (`shaders/select.wgsl`): the same f32
//! adjustment arithmetic, the exact top-k order, and f64 sums.

use emberlm::sampling::candidates::{Candidates, LogitAdjustment, SelectRequest};
use rand::Rng;

/// The kernel's f32 form of an adjustment: (bias, positive factor, non-positive factor, delta).
pub fn gpu_terms(a: &LogitAdjustment) -> (f32, f32, f32, f32) {
    let (pos, neg) = match a.repetition {
        Some(r) => ((1.0 / f64::from(r)) as f32, r),
        None => (1.0, 1.0),
    };
    let delta = a.penalty.map_or(0.0, |p| {
        (f64::from(p.presence) + f64::from(p.frequency) * f64::from(p.count)) as f32
    });
    (a.bias.unwrap_or(0.0), pos, neg, delta)
}

fn sat(x: f32) -> f32 {
    x.clamp(-f32::MAX, f32::MAX)
}

/// The adjusted row as the kernel computes it.
pub fn adjusted_row(row: &[f32], request: &SelectRequest) -> Vec<f32> {
    let mut out = row.to_vec();
    for a in &request.adjustments {
        let (bias, pos, neg, delta) = gpu_terms(a);
        let x = &mut out[a.id as usize];
        let mut v = sat(*x + bias);
        v = sat(v * if v > 0.0 { pos } else { neg });
        v = sat(v - delta);
        *x = v;
    }
    if let Some(words) = &request.mask {
        for (i, x) in out.iter_mut().enumerate() {
            if words[i / 32] >> (i % 32) & 1 == 0 {
                *x = -f32::MAX;
            }
        }
    }
    out
}

/// A random constraint bitset over `n` tokens with at least one allowed: `None` (a third of the
/// time), about a third allowed, or a handful (fewer than most `k`).
pub fn random_mask(rng: &mut impl Rng, n: usize) -> Option<Vec<u32>> {
    let density = match rng.random_range(0..3) {
        0 => return None,
        1 => 0.3,
        _ => 3.0 / n as f64,
    };
    let mut words = vec![0u32; n.div_ceil(32)];
    for i in 0..n {
        if rng.random_bool(density.min(1.0)) {
            words[i / 32] |= 1 << (i % 32);
        }
    }
    let one = rng.random_range(0..n);
    words[one / 32] |= 1 << (one % 32);
    Some(words)
}

fn order_key(x: f32, id: u32) -> (std::cmp::Reverse<u32>, u32) {
    let bits = (x + 0.0).to_bits();
    let asc = if bits >> 31 == 1 {
        !bits
    } else {
        bits | 0x8000_0000
    };
    (std::cmp::Reverse(asc), id)
}

/// What the kernel should return for `row` and `request`.
pub fn select(row: &[f32], request: &SelectRequest) -> Candidates {
    let n = request.n as usize;
    let row = &row[..n];
    let adj = adjusted_row(row, request);
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_by_key(|&i| order_key(adj[i as usize], i));
    let k = (request.k as usize).min(n);
    let chosen = &order[..k];
    let raw_max = row.iter().fold(f32::MIN, |m, &x| m.max(x));
    let raw_sum: f64 = row
        .iter()
        .map(|&x| (f64::from(x) - f64::from(raw_max)).exp())
        .sum();
    let adj_max = adj.iter().fold(f32::MIN, |m, &x| m.max(x));
    let inv_t = 1.0 / f64::from(request.temperature);
    let w = |x: f32| ((f64::from(x) - f64::from(adj_max)) * inv_t).exp();
    let mut is_chosen = vec![false; n];
    for &i in chosen {
        is_chosen[i as usize] = true;
    }
    let tail: f64 = (0..n).filter(|&i| !is_chosen[i]).map(|i| w(adj[i])).sum();
    let adj_tail: f64 = request
        .adjustments
        .iter()
        .filter(|a| !is_chosen[a.id as usize])
        .map(|a| w(adj[a.id as usize]))
        .sum();
    Candidates {
        non_finite: row.iter().any(|x| !x.is_finite()),
        n: n as u32,
        raw_max,
        raw_sum: raw_sum as f32,
        adjusted_max: adj_max,
        tail_sum: tail as f32,
        adjusted_tail_sum: adj_tail as f32,
        ids: chosen.to_vec(),
        adjusted: chosen.iter().map(|&i| adj[i as usize]).collect(),
        raw: chosen.iter().map(|&i| row[i as usize]).collect(),
        adjusted_raw: request
            .adjustments
            .iter()
            .map(|a| row[a.id as usize])
            .collect(),
    }
}

/// A random row of `n` logits: smooth values, or few distinct values (many ties), mostly
/// negative or mixed.
pub fn random_row(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    match rng.random_range(0..3) {
        0 => (0..n).map(|_| rng.random_range(-12.0f32..18.0)).collect(),
        1 => (0..n)
            .map(|_| rng.random_range(-6i32..3) as f32 * 0.5)
            .collect(),
        _ => (0..n)
            .map(|_| {
                let z: f32 = rng.random_range(-1.0f32..1.0);
                -30.0 + 4.0 * z * z * z
            })
            .collect(),
    }
}
