//! Matrix-vector and matrix products, accumulated in f64; natively, large products are split
//! over threads by rows.

/// `y = W·x (+ bias)`: `w: [rows, cols]` row-major, `x: [cols]`, `bias: [rows]` → `y: [rows]`.
///
/// # Panics
/// When the slices do not match the shape (a programming error in the caller).
pub fn matvec(w: &[f32], x: &[f32], bias: Option<&[f32]>, rows: usize, cols: usize) -> Vec<f32> {
    assert_eq!(w.len(), rows * cols, "w must be [rows, cols]");
    assert_eq!(x.len(), cols, "x must be [cols]");
    (0..rows)
        .map(|r| {
            let row = &w[r * cols..(r + 1) * cols];
            let dot: f64 = row
                .iter()
                .zip(x)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            let b = bias.map_or(0.0, |b| f64::from(b[r]));
            (dot + b) as f32
        })
        .collect()
}

/// `Y = X·Wᵀ (+ bias)` for several tokens at once: `w: [rows, cols]`, `x: [n, cols]`,
/// `bias: [rows]` → `[n, rows]`, accumulated in f64.
///
/// Each weight row is read once for all `n` tokens (a prefill streams the weights once, not once
/// per token), and each output is the same f64 dot product whatever `n` is, so a prefill and a
/// token-by-token decode give identical bits. Natively the rows are split over threads when the
/// product is large enough to pay for them.
///
/// # Panics
/// When the slices do not match the shapes (a programming error in the caller).
pub fn matmul(w: &[f32], x: &[f32], bias: Option<&[f32]>, rows: usize, cols: usize) -> Vec<f32> {
    assert_eq!(w.len(), rows * cols, "w must be [rows, cols]");
    assert!(
        cols > 0 && x.len().is_multiple_of(cols),
        "x must be [n, cols]"
    );
    if let Some(b) = bias {
        assert_eq!(b.len(), rows, "bias must be [rows]");
    }
    let n = x.len() / cols;
    // Computed row-major by weight row (`[rows, n]`), the order the work is split in, then
    // transposed into the `[n, rows]` the caller wants.
    let by_row = |r0: usize, r1: usize| -> Vec<f32> {
        let mut out = Vec::with_capacity((r1 - r0) * n);
        for r in r0..r1 {
            let row = &w[r * cols..(r + 1) * cols];
            let b = bias.map_or(0.0, |b| f64::from(b[r]));
            out.extend(x.chunks_exact(cols).map(|xt| (dot(row, xt) + b) as f32));
        }
        out
    };
    let parts = split_rows(rows, rows * cols * n, &by_row);
    let mut y = vec![0.0f32; n * rows];
    let mut r = 0;
    for part in parts {
        for chunk in part.chunks_exact(n.max(1)) {
            for (t, &v) in chunk.iter().enumerate() {
                y[t * rows + r] = v;
            }
            r += 1;
        }
    }
    y
}

/// Multiply-adds below which one thread does the whole product: spawning costs tens of
/// microseconds, as much as a quarter of a million f64 multiply-adds.
#[cfg(not(target_arch = "wasm32"))]
const THREAD_MIN_WORK: usize = 1 << 18;

/// Runs `f(r0, r1)` over `0..rows` cut into contiguous ranges, one per thread, and returns the
/// results in row order.
#[cfg(not(target_arch = "wasm32"))]
fn split_rows<F>(rows: usize, work: usize, f: &F) -> Vec<Vec<f32>>
where
    F: Fn(usize, usize) -> Vec<f32> + Sync,
{
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let threads = *THREADS.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(16)
    });
    let threads = threads.min(work / THREAD_MIN_WORK).min(rows).max(1);
    if threads == 1 {
        return vec![f(0, rows)];
    }
    let per = rows.div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..rows)
            .step_by(per)
            .map(|r0| s.spawn(move || f(r0, (r0 + per).min(rows))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// The browser's wasm32 has no threads here: one range, on the caller's thread.
#[cfg(target_arch = "wasm32")]
fn split_rows<F>(rows: usize, _work: usize, f: &F) -> Vec<Vec<f32>>
where
    F: Fn(usize, usize) -> Vec<f32>,
{
    vec![f(0, rows)]
}

/// Dot product accumulated in f64. Eight independent partial sums, so the loop vectorizes and
/// does not serialise on one add chain.
pub(super) fn dot(a: &[f32], b: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += f64::from(x[i]) * f64::from(y[i]);
        }
    }
    acc.iter().sum::<f64>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matvec_small_exact() {
        let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let x = [1.0, 0.5, -1.0];
        assert_eq!(matvec(&w, &x, None, 2, 3), vec![-1.0, 0.5]);
        assert_eq!(matvec(&w, &x, Some(&[1.0, -1.0]), 2, 3), vec![0.0, -0.5]);
    }

    #[test]
    fn matmul_matches_matvec_per_token_single_and_threaded() {
        // 300·100·10 multiply-adds is above THREAD_MIN_WORK, so this also runs split over
        // threads where the machine has more than one core; n = 1 stays on one thread.
        let (rows, cols) = (300, 100);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5)
            .collect();
        let bias: Vec<f32> = (0..rows).map(|r| r as f32 * 0.001).collect();
        for n in [1, 10] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 13) % 29) as f32 * 0.1 - 1.4)
                .collect();
            let y = matmul(&w, &x, Some(&bias), rows, cols);
            assert_eq!(y.len(), n * rows);
            for t in 0..n {
                let want = matvec(&w, &x[t * cols..(t + 1) * cols], Some(&bias), rows, cols);
                for (a, b) in y[t * rows..(t + 1) * rows].iter().zip(&want) {
                    assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
                }
            }
            // a token's outputs do not depend on which other tokens share the call
            assert_eq!(matmul(&w, &x[..cols], Some(&bias), rows, cols), y[..rows]);
        }
    }

    #[test]
    fn dot_handles_every_length() {
        for n in [0, 1, 7, 8, 9, 33] {
            let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let b = vec![2.0f32; n];
            assert_eq!(dot(&a, &b), (n * n.saturating_sub(1)) as f64);
        }
    }
}
