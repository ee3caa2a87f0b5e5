//! Plain CPU implementations of the kernels, accumulating in f64: the oracle for GPU tests.

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

/// RMSNorm over rows of length `n`: `x: [n_rows, n]`, `weight: [n]` → `[n_rows, n]`.
///
/// # Panics
/// When the slices do not match the shape (a programming error in the caller).
pub fn rms_norm(x: &[f32], weight: &[f32], n: usize, eps: f32) -> Vec<f32> {
    assert_eq!(weight.len(), n, "weight must be [n]");
    assert!(n > 0 && x.len().is_multiple_of(n), "x must be [n_rows, n]");
    x.chunks(n)
        .flat_map(|row| {
            let mean_sq = row
                .iter()
                .map(|&v| f64::from(v) * f64::from(v))
                .sum::<f64>()
                / n as f64;
            let scale = 1.0 / (mean_sq + f64::from(eps)).sqrt();
            row.iter()
                .zip(weight)
                .map(move |(&v, &g)| (f64::from(v) * scale * f64::from(g)) as f32)
        })
        .collect()
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
    fn rms_norm_unit_rows() {
        // mean of squares of [3, 4] is 12.5
        let y = rms_norm(&[3.0, 4.0, 0.0, 0.0], &[1.0, 2.0], 2, 0.0);
        let s = 1.0 / 12.5f64.sqrt();
        assert!((f64::from(y[0]) - 3.0 * s).abs() < 1e-6);
        assert!((f64::from(y[1]) - 8.0 * s).abs() < 1e-6);
        // an all-zero row with eps = 0 divides 0 by 0: the reference says NaN, honestly
        assert!(y[2].is_nan());
    }
}
