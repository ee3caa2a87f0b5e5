//! The matrix products' precision (`precision`): `f32` (the default), `f16` (the products'
//! inputs, activations and dequantized weights, rounded to f16 and multiplied in f16, each
//! product accumulated in f32, and the activations that only a product reads, the attention
//! output and the feed-forward hidden state, stored as f16 between kernels; the residual stream,
//! norms, attention's arithmetic and the logits stay f32; needs the adapter feature
//! `shader-f16`) or `auto` (f16 on a GPU
//! with the feature, otherwise f32 with a notice: software adapters emulate f16 arithmetic,
//! which makes it several times slower there).

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::error::{Error, Result};

/// What the user asks for (`precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// f32 throughout.
    #[default]
    F32,
    /// f16 inputs to the matrix products; an error without `shader-f16`.
    F16,
    /// f16 on a hardware adapter with `shader-f16`, f32 otherwise.
    Auto,
}

impl Precision {
    /// The name users write.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::Auto => "auto",
        }
    }

    /// The precision the products run in on an adapter with (`true`) or without `shader-f16`,
    /// `software` or not, and a notice when `auto` chose f32.
    pub fn resolve(
        self,
        shader_f16: bool,
        software: bool,
    ) -> Result<(MatmulPrecision, Option<String>)> {
        match (self, shader_f16) {
            (Precision::F32, _) => Ok((MatmulPrecision::F32, None)),
            (Precision::Auto, true) if software => Ok((
                MatmulPrecision::F32,
                Some(
                    "precision auto: f32 on this software adapter (it emulates f16 arithmetic, \
                     which is slower than f32 there)"
                        .to_string(),
                ),
            )),
            (Precision::F16 | Precision::Auto, true) => Ok((MatmulPrecision::F16, None)),
            (Precision::F16, false) => Err(Error::invalid(
                "precision",
                "f16 needs the adapter feature shader-f16, which this adapter does not offer \
                 (use f32, or auto to fall back)",
            )),
            (Precision::Auto, false) => Ok((
                MatmulPrecision::F32,
                Some(
                    "precision auto: the adapter has no shader-f16, so the matrix products run in f32"
                        .to_string(),
                ),
            )),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Precision {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" => Ok(Precision::F32),
            "f16" => Ok(Precision::F16),
            "auto" => Ok(Precision::Auto),
            other => Err(Error::invalid(
                "precision",
                format!("`{other}` is not a precision (f32, f16 or auto)"),
            )),
        }
    }
}

/// The precision the matrix products run in on a device (`precision` resolved).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MatmulPrecision {
    /// Inputs, products and sums in f32.
    #[default]
    F32,
    /// Inputs rounded to f16 and multiplied in f16; products summed in f32.
    F16,
}

impl MatmulPrecision {
    /// `f32` or `f16`.
    pub fn as_str(self) -> &'static str {
        match self {
            MatmulPrecision::F32 => "f32",
            MatmulPrecision::F16 => "f16",
        }
    }
}

impl fmt::Display for MatmulPrecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_follows_the_feature() {
        assert_eq!(
            Precision::F32.resolve(true, false).unwrap().0,
            MatmulPrecision::F32
        );
        assert_eq!(
            Precision::F16.resolve(true, true).unwrap().0,
            MatmulPrecision::F16
        );
        let err = Precision::F16
            .resolve(false, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("shader-f16") && err.contains("precision"),
            "{err}"
        );
        let (p, notice) = Precision::Auto.resolve(false, false).unwrap();
        assert_eq!(p, MatmulPrecision::F32);
        assert!(notice.unwrap().contains("shader-f16"));
        assert_eq!(
            Precision::Auto.resolve(true, false).unwrap(),
            (MatmulPrecision::F16, None)
        );
        let (p, notice) = Precision::Auto.resolve(true, true).unwrap();
        assert_eq!(p, MatmulPrecision::F32);
        assert!(notice.unwrap().contains("software"));
        assert!("f8"
            .parse::<Precision>()
            .unwrap_err()
            .to_string()
            .contains("precision"));
        assert_eq!("F16".parse::<Precision>().unwrap(), Precision::F16);
    }
}
