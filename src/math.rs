//! The transcendental functions the forward pass and sampling use, with the same bits on every
//! target: `f32::exp` and friends call the platform's C library natively (glibc chooses an FMA
//! variant at run time on CPUs that have it) and a port of musl's in WebAssembly, which round
//! differently in the last bit; a model whose logits go through them would not give the same
//! bits natively and in the browser. These go through the `libm` crate everywhere.

/// `eˣ` (f32).
#[inline]
pub fn exp_f32(x: f32) -> f32 {
    libm::expf(x)
}

/// `tanh x` (f32).
#[inline]
pub fn tanh_f32(x: f32) -> f32 {
    libm::tanhf(x)
}

/// `eˣ` (f64).
#[inline]
pub fn exp(x: f64) -> f64 {
    libm::exp(x)
}

/// `ln x` (f64).
#[inline]
pub fn ln(x: f64) -> f64 {
    libm::log(x)
}

/// `(sin x, cos x)` (f64).
#[inline]
pub fn sin_cos(x: f64) -> (f64, f64) {
    libm::sincos(x)
}

/// `xʸ` (f64).
#[inline]
pub fn pow(x: f64, y: f64) -> f64 {
    libm::pow(x, y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agree_with_std_to_an_ulp() {
        for i in -200..200 {
            let x = i as f32 * 0.173;
            let (a, b) = (exp_f32(x), x.exp());
            assert!(
                (a - b).abs() <= b.abs() * 2.0 * f32::EPSILON,
                "exp {x}: {a} vs {b}"
            );
            let (a, b) = (tanh_f32(x), x.tanh());
            assert!((a - b).abs() <= 2.0 * f32::EPSILON, "tanh {x}: {a} vs {b}");
            let x = f64::from(x) * 7.0;
            let ((s, c), (ws, wc)) = (sin_cos(x), x.sin_cos());
            assert!((s - ws).abs() <= 4.0 * f64::EPSILON && (c - wc).abs() <= 4.0 * f64::EPSILON);
            let (a, b) = (exp(x / 7.0), (x / 7.0).exp());
            assert!((a - b).abs() <= b * 2.0 * f64::EPSILON);
        }
        assert_eq!(ln(1.0), 0.0);
        assert!((pow(500_000.0, -0.5) - 500_000f64.powf(-0.5)).abs() < 1e-18);
    }
}
