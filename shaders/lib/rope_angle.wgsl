// RoPE angles in exact integer arithmetic (see rope.wgsl for why): the fraction of a turn
// `pos * freq` reduced modulo one turn, and its sin/cos from a quadrant and a polynomial.
// Shared by the RoPE kernel and the linear layers' fused Q/K/V epilogue.

// High 32 bits of the 64-bit product a * b, from 16-bit halves (WGSL has no mulhi).
fn mul_hi(a: u32, b: u32) -> u32 {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let lo_hi = a0 * b1;
    let hi_lo = a1 * b0;
    let mid = ((a0 * b0) >> 16u) + (lo_hi & 0xffffu) + (hi_lo & 0xffffu);
    return a1 * b1 + (lo_hi >> 16u) + (hi_lo >> 16u) + (mid >> 16u);
}

// (sin, cos) of the angle `pos` turns-per-position `(hi, lo)` (0.64 fixed point) make.
fn rope_sin_cos_fixed(pos: u32, hi: u32, lo: u32) -> vec2<f32> {
    // fraction of a turn, 0.32 fixed point: (pos * (hi.lo)) mod 1
    let turn = pos * hi + mul_hi(pos, lo);
    // nearest quarter turn, and the remainder in [-1/8, 1/8] turn
    let quadrant = ((turn + 0x20000000u) >> 30u) & 3u;
    let rest = bitcast<i32>(turn - (quadrant << 30u));
    // 2 pi / 2^32
    let r = f32(rest) * 1.4629180792671596e-9;
    let r2 = r * r;
    // Taylor series to r^11 / r^12: |error| < 2e-10 for |r| <= pi/4
    let s = r * (1.0 + r2 * (-1.0 / 6.0 + r2 * (1.0 / 120.0 + r2 * (-1.0 / 5040.0
        + r2 * (1.0 / 362880.0 + r2 * (-1.0 / 39916800.0))))));
    let c = 1.0 + r2 * (-0.5 + r2 * (1.0 / 24.0 + r2 * (-1.0 / 720.0 + r2 * (1.0 / 40320.0
        + r2 * (-1.0 / 3628800.0 + r2 * (1.0 / 479001600.0))))));
    // sin/cos of r + quadrant * pi/2
    var sc = vec2<f32>(s, c);
    if (quadrant & 1u) == 1u {
        sc = vec2<f32>(c, -s);
    }
    if quadrant >= 2u {
        sc = -sc;
    }
    return sc;
}
