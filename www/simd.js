// Whether this JavaScript engine runs WebAssembly SIMD (fixed-width, 128-bit), which every
// build of the module needs (the CPU backend's integer dot products are SIMD128). Every browser
// with WebGPU has it, and so have Chrome 91, Firefox 89, Safari 16.4 and Node 16.4 on. The
// test: does the smallest module returning a v128 constant validate?

const SIMD_PROBE = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // header
  0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7b, // type: () -> v128
  0x03, 0x02, 0x01, 0x00, // one function of that type
  0x0a, 0x16, 0x01, 0x14, 0x00, 0xfd, 0x0c, ...new Array(16).fill(0), 0x0b, // v128.const 0
]);

/** `true` where WebAssembly SIMD validates. */
export function simdSupported() {
  return WebAssembly.validate(SIMD_PROBE);
}

/** Why the module cannot run here (a sentence), or null where it can. */
export function whySimdMissing() {
  if (simdSupported()) return null;
  return 'this browser has no WebAssembly SIMD (fixed-width, 128-bit), which emberlm needs ' +
    '(Chrome and Edge 91, Firefox 89, Safari 16.4 and later have it)';
}

// Relaxed SIMD (Chromium 156 and Firefox 153 ESR validate it): the smallest module using
// `i16x8.relaxed_dot_i8x16_i7x16_s` on two v128 constants, which the threaded build with
// relaxed SIMD needs (its tiled matrix products).
const RELAXED_PROBE = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // header
  0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7b, // type: () -> v128
  0x03, 0x02, 0x01, 0x00, // one function of that type
  0x0a, 0x2b, 0x01, 0x29, 0x00, // code: one body of 41 bytes, no locals
  0xfd, 0x0c, ...new Array(16).fill(0), // v128.const 0
  0xfd, 0x0c, ...new Array(16).fill(0), // v128.const 0
  0xfd, 0x92, 0x02, 0x0b, // i16x8.relaxed_dot_i8x16_i7x16_s, end
]);

/** `true` where WebAssembly relaxed SIMD validates. */
export function relaxedSimdSupported() {
  return WebAssembly.validate(RELAXED_PROBE);
}
