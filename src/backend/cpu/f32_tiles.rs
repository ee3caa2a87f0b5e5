//! The product of weight rows unpacked to f32 (F32, F16 and BF16 weights, and every type
//! under exact products) with several
//! tokens, a tile of [`ROWS`] rows × [`TOKENS`] tokens at a time: each step along the row reads
//! the tile's weights and activations once and updates its twelve sums, where a dot product per
//! (row, token) would read both for one sum and wait on that sum's additions.
//!
//! Every sum is [`dot_f32`]'s, in its order (eight lane sums of products added one chunk of
//! eight after another, no fused multiply-add, then the lanes in order and the tail), so the
//! result is the same bits as a dot product per pair, natively and in the browser.

use super::dot::dot_f32;

/// Weight rows per tile.
pub const ROWS: usize = 3;
/// Tokens per tile.
const TOKENS: usize = 4;
/// Lanes of each partial sum (as [`dot_f32`]).
const LANES: usize = 8;

/// `out[r · tokens + t] = dot_f32(rows[r], x[t])` for `rows: [n, cols]` (`n` at most
/// [`ROWS`]), `x: [tokens, cols]` and `out: [n, tokens]`.
pub fn rows_times_tokens(rows: &[f32], cols: usize, x: &[f32], out: &mut [f32]) {
    let n = rows.len() / cols.max(1);
    let tokens = x.len() / cols.max(1);
    debug_assert!(n <= ROWS && out.len() == n * tokens);
    #[cfg(target_arch = "x86_64")]
    if super::dot::has_avx2() {
        // SAFETY: the CPU has AVX2 (checked above).
        unsafe { tiles_avx2(rows, cols, x, n, tokens, out) };
        return;
    }
    tiles(rows, cols, x, n, tokens, out);
}

/// [`tiles`] compiled for AVX2 (the lane sums in 256-bit registers; no FMA).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tiles_avx2(
    rows: &[f32],
    cols: usize,
    x: &[f32],
    n: usize,
    tokens: usize,
    out: &mut [f32],
) {
    tiles(rows, cols, x, n, tokens, out);
}

/// Whole tiles of [`ROWS`] rows × [`TOKENS`] tokens, the rest a dot product per pair.
#[inline(always)]
fn tiles(rows: &[f32], cols: usize, x: &[f32], n: usize, tokens: usize, out: &mut [f32]) {
    let whole = cols / LANES * LANES;
    let mut t = 0;
    if n == ROWS {
        while t + TOKENS <= tokens {
            let mut acc = [[[0.0f32; LANES]; TOKENS]; ROWS];
            let mut k = 0;
            while k < whole {
                let w: [&[f32]; ROWS] = std::array::from_fn(|r| &rows[r * cols + k..][..LANES]);
                for j in 0..TOKENS {
                    let xv = &x[(t + j) * cols + k..][..LANES];
                    for r in 0..ROWS {
                        for i in 0..LANES {
                            acc[r][j][i] += w[r][i] * xv[i];
                        }
                    }
                }
                k += LANES;
            }
            for r in 0..ROWS {
                for j in 0..TOKENS {
                    let a = &rows[r * cols + whole..(r + 1) * cols];
                    let b = &x[(t + j) * cols + whole..(t + j + 1) * cols];
                    let tail: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
                    out[r * tokens + t + j] = acc[r][j].iter().sum::<f32>() + tail;
                }
            }
            t += TOKENS;
        }
    }
    for r in 0..n {
        let row = &rows[r * cols..(r + 1) * cols];
        for j in t..tokens {
            out[r * tokens + j] = dot_f32(row, &x[j * cols..(j + 1) * cols]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shape of tile and remainder gives the bits of a dot product per pair.
    #[test]
    fn tiles_give_the_bits_of_one_dot_product_per_pair() {
        let mut seed = 7u32;
        let mut value = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
        };
        for cols in [1, 7, 8, 13, 64, 389] {
            for n in 1..=ROWS {
                for tokens in [1, 3, 4, 5, 9, 12] {
                    let rows: Vec<f32> = (0..n * cols).map(|_| value()).collect();
                    let x: Vec<f32> = (0..tokens * cols).map(|_| value()).collect();
                    let mut out = vec![f32::NAN; n * tokens];
                    rows_times_tokens(&rows, cols, &x, &mut out);
                    for r in 0..n {
                        for t in 0..tokens {
                            let want = dot_f32(&rows[r * cols..][..cols], &x[t * cols..][..cols]);
                            assert_eq!(
                                out[r * tokens + t].to_bits(),
                                want.to_bits(),
                                "cols {cols}, {n} rows, {tokens} tokens: row {r} token {t}"
                            );
                        }
                    }
                }
            }
        }
    }
}
