//! Tensor element types as stored on disk (and kept on the GPU): the GGML type ids, block
//! geometry and byte sizes. Dequantization to f32 lives here too, so that the CPU path is the
//! exact reference the GPU kernels are checked against.

use crate::error::{Error, Result};

/// A tensor's storage type. Quantized types pack `block_elements()` values into
/// `block_bytes()` bytes; a tensor's element count must be a multiple of the block size.
/// Variant names are the format's own (`Q4_K`, not `Q4K`).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (the upper half of an f32).
    BF16,
    /// 32 values: f16 scale `d`, 32 × i8; `x = d·q`.
    Q8_0,
    /// 32 values: f16 scale `d`, 16 bytes of 4-bit `q`; `x = d·(q − 8)`.
    Q4_0,
    /// 32 values: f16 scale `d`, f16 minimum `m`, 16 bytes of 4-bit `q`; `x = d·q + m`.
    Q4_1,
    /// 256 values in 8 sub-blocks of 32 with 6-bit scales and minimums; 4-bit `q`.
    Q4_K,
    /// 256 values in 8 sub-blocks of 32 with 6-bit scales and minimums; 5-bit `q`.
    Q5_K,
    /// 256 values in 16 sub-blocks of 16 with 8-bit scales; 6-bit `q`.
    Q6_K,
}

impl DType {
    /// Every supported type.
    pub const ALL: [DType; 9] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ];

    /// The type for a GGML type id, or `None` when emberlm does not support it
    /// (see [`ggml_type_name`] for a name to put in the error).
    pub fn from_ggml(id: u32) -> Option<DType> {
        Some(match id {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::Q4_0,
            3 => DType::Q4_1,
            8 => DType::Q8_0,
            12 => DType::Q4_K,
            13 => DType::Q5_K,
            14 => DType::Q6_K,
            30 => DType::BF16,
            _ => return None,
        })
    }

    /// The GGML type id.
    pub fn ggml_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q8_0 => 8,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::BF16 => 30,
        }
    }

    /// The name used by GGUF tools and safetensors (`F32`, `Q4_K`, ...).
    pub fn name(self) -> &'static str {
        ggml_type_name(self.ggml_id())
    }

    /// Values per block (1 for float types).
    pub fn block_elements(self) -> u64 {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => 32,
            DType::Q4_K | DType::Q5_K | DType::Q6_K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
        }
    }

    /// Bytes taken by `elements` values, or an error when `elements` is not a whole number of
    /// blocks or the size overflows. `what` names the tensor for the message.
    pub fn bytes_for(self, elements: u64, what: &str) -> Result<u64> {
        let block = self.block_elements();
        if !elements.is_multiple_of(block) {
            return Err(Error::invalid(
                "elements",
                format!(
                    "tensor `{what}` has {elements} values, not a multiple of the {} block size {block}",
                    self.name()
                ),
            ));
        }
        (elements / block)
            .checked_mul(self.block_bytes())
            .ok_or_else(|| {
                Error::invalid(
                    "elements",
                    format!("tensor `{what}`: byte size of {elements} values overflows"),
                )
            })
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A readable name for any GGML type id, supported or not (for error messages).
pub fn ggml_type_name(id: u32) -> &'static str {
    match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_ids_round_trip() {
        for t in DType::ALL {
            assert_eq!(DType::from_ggml(t.ggml_id()), Some(t));
        }
        assert_eq!(DType::from_ggml(6), None);
        assert_eq!(ggml_type_name(6), "Q5_0");
    }

    #[test]
    fn byte_sizes_follow_blocks() {
        assert_eq!(DType::Q4_K.bytes_for(512, "t").unwrap(), 288);
        assert_eq!(DType::F16.bytes_for(3, "t").unwrap(), 6);
        let err = DType::Q8_0
            .bytes_for(33, "blk.0.ffn_up.weight")
            .unwrap_err();
        assert!(err.to_string().contains("blk.0.ffn_up.weight"), "{err}");
        assert!(DType::F32.bytes_for(u64::MAX, "t").is_err());
    }
}
