// Activation functions shared by the elementwise kernels and the linear layers' epilogues.

// Largest argument given to exp: exp(80) is finite in f32, and x / (1 + exp(80)) is 0 to
// within f32's resolution of any activation, so clamping changes nothing but avoids inf.
const EXP_CLAMP: f32 = 80.0;

// x * sigmoid(x)
fn silu(x: f32) -> f32 {
    return x / (1.0 + exp(min(-x, EXP_CLAMP)));
}

// 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): no tanh, whose
// large-argument behaviour varies between implementations. The cubic uses x clamped to
// [-20, 20], where sigmoid(2u) is already 0 or 1 in f32, so it cannot overflow.
fn gelu_tanh(x: f32) -> f32 {
    let c = clamp(x, -20.0, 20.0);
    let u = 0.7978845608028654 * (c + 0.044715 * c * c * c);
    return x / (1.0 + exp(min(-2.0 * u, EXP_CLAMP)));
}

// erf(x), Abramowitz and Stegun 7.1.26 (absolute error under 1.5e-7; WGSL has no erf).
fn erf_approx(x: f32) -> f32 {
    let a = abs(x);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    let y = 1.0 - poly * exp(-min(a * a, EXP_CLAMP));
    return select(y, -y, x < 0.0);
}

// The exact GELU, x * Phi(x) = x / 2 * (1 + erf(x / sqrt(2))) (BERT).
fn gelu_erf(x: f32) -> f32 {
    return 0.5 * x * (1.0 + erf_approx(x * 0.7071067811865476));
}
