//! The transcendental functions the forward pass and sampling use, with the same bits on every
//! target: `f32::exp` and friends call the platform's C library natively (glibc chooses an FMA
//! variant at run time on CPUs that have it) and a port of musl's in WebAssembly, which round
//! differently in the last bit; a model whose logits go through them would not give the same
//! bits natively and in the browser. These go through the `libm` crate everywhere, except
//! [`softmax_exp`], written out in f32 operations that every target rounds alike.

/// `eˣ` (f32).
#[inline]
pub fn exp_f32(x: f32) -> f32 {
    libm::expf(x)
}

/// `eˣ` for a softmax's shifted scores (`x ≤ 0`), in plain f32 operations (no table, no
/// library call, no fused multiply-add) that every target computes alike and that a compiler
/// turns into SIMD over a loop: attention's softmax takes one per score (over a million per
/// token at 4,096 positions), where [`exp_f32`]'s scalar call was most of a long step.
///
/// `x = n·ln 2 + r` with `n` rounded to nearest by adding 1.5·2²³, `r` by ln 2 in two parts
/// (the first exact times `n`), `eʳ` by a degree-7 polynomial on |r| ≤ ln 2 / 2, then 2ⁿ put in
/// the exponent bits: within 1 ulp of eˣ (of every f32 from −87.34 to 0, 99.2 % give the f32
/// nearest eˣ and the rest one ulp off; the tests check a sample of them). 0 below
/// −87.34 (under f32's smallest normal, where eˣ would be subnormal), NaN for NaN; a positive
/// `x` (no softmax input) is taken as 0.
#[inline(always)]
pub fn softmax_exp(x: f32) -> f32 {
    // adding it leaves round(v) in the low mantissa bits (v within ±2²²)
    const SHIFTER: f32 = 12_582_912.0;
    // ln 2 = LN2_HI + LN2_LO; LN2_HI has 9 significant bits, so n · LN2_HI is exact
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // ln 2⁻¹²⁶: below it the result would be subnormal
    const LOWEST: f32 = -87.336_54;
    // eʳ − 1 − r = r² · (1/2 + r/6 + …), minimax on |r| ≤ ln 2 / 2
    const P: [f32; 6] = [
        1.987_569_2e-4,
        1.398_2e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ];
    let c = x.clamp(LOWEST, 0.0);
    let t = c * std::f32::consts::LOG2_E + SHIFTER;
    let n = t - SHIFTER;
    let r = (c - n * LN2_HI) - n * LN2_LO;
    let poly = ((((P[0] * r + P[1]) * r + P[2]) * r + P[3]) * r + P[4]) * r + P[5];
    let e_r = poly * (r * r) + r + 1.0;
    // 2ⁿ: n (in −126..=0) is t's bits less the shifter's
    let biased = (t.to_bits() as i32 - SHIFTER.to_bits() as i32 + 127) as u32;
    let y = e_r * f32::from_bits(biased << 23);
    if x < LOWEST {
        0.0
    } else {
        y
    }
}

/// [`softmax_exp`] in f64, for sampling's softmax and log-sum-exp over a whole vocabulary
/// (the `libm` call took about 14 ns per token id: a millisecond of every decode step at
/// 50,000 ids, with the CPU's threads idle). The same steps: `x = n·ln 2 + r` with `n`
/// rounded to nearest by adding 1.5·2⁵², `r` by ln 2 in two parts (the first exact times `n`),
/// `eʳ` by its Taylor series to r¹³ on |r| ≤ ln 2 / 2 (the terms left out are below 2⁻⁵⁷ of
/// it), then 2ⁿ put in the exponent bits; plain f64 operations, so every target gives the same
/// bits. Within 2 ulp of eˣ (the tests check a sample of every range); 0 below −708.39 (under
/// f64's smallest normal, where eˣ would be subnormal), NaN for NaN; a positive `x` is taken
/// as 0.
#[inline(always)]
pub fn softmax_exp_f64(x: f64) -> f64 {
    // adding it leaves round(v) in the low mantissa bits (v within ±2⁵¹)
    const SHIFTER: f64 = 6_755_399_441_055_744.0;
    // ln 2 = LN2_HI + LN2_LO; LN2_HI has 32 significant bits, so n · LN2_HI is exact
    const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76);
    // ln 2⁻¹⁰²²: below it the result would be subnormal
    const LOWEST: f64 = -708.396_418_532_264_1;
    // 1/k! for k = 13 down to 2: eʳ − 1 − r = r² · (1/2 + r/6 + …)
    const P: [f64; 12] = [
        1.0 / 6_227_020_800.0,
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
    ];
    let c = x.clamp(LOWEST, 0.0);
    let t = c * std::f64::consts::LOG2_E + SHIFTER;
    let n = t - SHIFTER;
    let r = (c - n * LN2_HI) - n * LN2_LO;
    let mut poly = P[0];
    for p in &P[1..] {
        poly = poly * r + p;
    }
    let e_r = poly * (r * r) + r + 1.0;
    // 2ⁿ: n (in −1022..=0) is t's bits less the shifter's
    let biased = (t.to_bits() as i64 - SHIFTER.to_bits() as i64 + 1023) as u64;
    let y = e_r * f64::from_bits(biased << 52);
    if x < LOWEST {
        0.0
    } else {
        y
    }
}

/// `tanh x` (f32).
#[inline]
pub fn tanh_f32(x: f32) -> f32 {
    libm::tanhf(x)
}

/// The error function `erf x` (f32).
#[inline]
pub fn erf_f32(x: f32) -> f32 {
    libm::erff(x)
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

    /// Distance in ulp between `got` and the f32 nearest `want`.
    fn ulps(got: f32, want: f64) -> u32 {
        (got.to_bits() as i64 - (want as f32).to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn softmax_exp_is_within_an_ulp_of_the_exact_value() {
        // every 97th f32 from 0 down to below the smallest normal's logarithm, plus the edges
        let mut worst = (0u32, 0.0f32);
        let mut bits = 0x8000_0000u32; // −0
        while bits <= (-90.0f32).to_bits() {
            let x = f32::from_bits(bits);
            let want = f64::from(x).exp();
            let got = softmax_exp(x);
            if x >= -87.336_54 {
                let u = ulps(got, want);
                if u > worst.0 {
                    worst = (u, x);
                }
            } else {
                assert_eq!(got, 0.0, "below the range: {x}");
            }
            bits += 97;
        }
        assert!(worst.0 <= 1, "{} ulp at {}", worst.0, worst.1);
        assert_eq!(softmax_exp(0.0), 1.0);
        assert_eq!(softmax_exp(-0.0), 1.0);
        assert!(softmax_exp(f32::NAN).is_nan());
        assert_eq!(softmax_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(softmax_exp(-1000.0), 0.0);
        // the scale's edge: n = −126 gives the smallest normal's power
        assert!(ulps(softmax_exp(-87.33), f64::from(-87.33f32).exp()) <= 1);
    }

    /// Distance in ulp between two positive f64.
    fn ulps64(got: f64, want: f64) -> u64 {
        (got.to_bits() as i64 - want.to_bits() as i64).unsigned_abs()
    }

    #[test]
    fn softmax_exp_f64_is_within_two_ulp_of_libm() {
        // a sample of every binade from 2⁻⁴⁰ to 708 (each scaled by an odd step), the
        // multiples of ln 2 / 2 where r is largest and their neighbours, and the edges
        let mut xs = vec![-1e-300, -f64::MIN_POSITIVE, -0.5, -1.0, -708.39, -708.396];
        for e in -40..10 {
            let base = (e as f64).exp2();
            for k in 0..2000 {
                xs.push(-base * (1.0 + k as f64 * 0.000_499_7));
            }
        }
        for k in 0..2045 {
            let at = -(k as f64) * std::f64::consts::LN_2 / 2.0;
            xs.extend([at, at.next_up(), at.next_down()]);
        }
        let mut worst = (0u64, 0.0f64);
        for x in xs.into_iter().filter(|&x| x <= 0.0) {
            let got = softmax_exp_f64(x);
            if x >= -708.396_418_532_264_1 {
                let u = ulps64(got, exp(x));
                if u > worst.0 {
                    worst = (u, x);
                }
            } else {
                assert_eq!(got, 0.0, "below the range: {x}");
            }
        }
        assert!(worst.0 <= 2, "{} ulp at {}", worst.0, worst.1);
        assert_eq!(softmax_exp_f64(0.0), 1.0);
        assert_eq!(softmax_exp_f64(-0.0), 1.0);
        assert!(softmax_exp_f64(f64::NAN).is_nan());
        assert_eq!(softmax_exp_f64(f64::NEG_INFINITY), 0.0);
        assert_eq!(softmax_exp_f64(-1000.0), 0.0);
    }

    #[test]
    fn softmax_exp_has_the_same_bits_over_a_slice_as_one_at_a_time() {
        // a loop the compiler vectorizes against calls it cannot (black_box): every lane the
        // same operations
        let xs: Vec<f32> = (0..4099).map(|i| -(i as f32) * 0.021_3).collect();
        let mut lanes = xs.clone();
        for x in lanes.iter_mut() {
            *x = softmax_exp(*x);
        }
        for (x, y) in xs.iter().zip(&lanes) {
            let one = softmax_exp(std::hint::black_box(*x));
            assert_eq!(one.to_bits(), y.to_bits(), "at {x}");
        }
    }
}
