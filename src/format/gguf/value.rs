//! Metadata values: [`GgufValue`] and [`GgufArray`].

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 6.
    F32(f32),
    /// Type 12.
    F64(f64),
    /// Type 7: one byte, 0 or 1.
    Bool(bool),
    /// Type 8: UTF-8.
    String(String),
    /// Type 9: element type, length, elements.
    Array(GgufArray),
}

/// A metadata array: every element has the one type the array declares.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufArray {
    /// Array of `u8`.
    U8(Vec<u8>),
    /// Array of `i8`.
    I8(Vec<i8>),
    /// Array of `u16`.
    U16(Vec<u16>),
    /// Array of `i16`.
    I16(Vec<i16>),
    /// Array of `u32`.
    U32(Vec<u32>),
    /// Array of `i32`.
    I32(Vec<i32>),
    /// Array of `u64`.
    U64(Vec<u64>),
    /// Array of `i64`.
    I64(Vec<i64>),
    /// Array of `f32`.
    F32(Vec<f32>),
    /// Array of `f64`.
    F64(Vec<f64>),
    /// Array of `bool`.
    Bool(Vec<bool>),
    /// Array of strings.
    String(Vec<String>),
    /// Array of arrays; each inner array declares its own element type.
    Array(Vec<GgufArray>),
}

impl GgufValue {
    /// The type as it would be written in a message: `u32`, `string`, `array<string>`, ...
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "u8",
            GgufValue::I8(_) => "i8",
            GgufValue::U16(_) => "u16",
            GgufValue::I16(_) => "i16",
            GgufValue::U32(_) => "u32",
            GgufValue::I32(_) => "i32",
            GgufValue::U64(_) => "u64",
            GgufValue::I64(_) => "i64",
            GgufValue::F32(_) => "f32",
            GgufValue::F64(_) => "f64",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(a) => a.type_name(),
        }
    }

    /// The value of any integer variant, widened.
    pub(super) fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(x) => x.into(),
            GgufValue::I8(x) => x.into(),
            GgufValue::U16(x) => x.into(),
            GgufValue::I16(x) => x.into(),
            GgufValue::U32(x) => x.into(),
            GgufValue::I32(x) => x.into(),
            GgufValue::U64(x) => x.into(),
            GgufValue::I64(x) => x.into(),
            _ => return None,
        })
    }
}

impl GgufArray {
    /// Number of elements (for an array of arrays, the number of inner arrays).
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::F64(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The array's type: `array<u32>`, `array<string>`, ...; `array<array>` for nested arrays,
    /// whose inner element types may differ from one inner array to the next.
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufArray::U8(_) => "array<u8>",
            GgufArray::I8(_) => "array<i8>",
            GgufArray::U16(_) => "array<u16>",
            GgufArray::I16(_) => "array<i16>",
            GgufArray::U32(_) => "array<u32>",
            GgufArray::I32(_) => "array<i32>",
            GgufArray::U64(_) => "array<u64>",
            GgufArray::I64(_) => "array<i64>",
            GgufArray::F32(_) => "array<f32>",
            GgufArray::F64(_) => "array<f64>",
            GgufArray::Bool(_) => "array<bool>",
            GgufArray::String(_) => "array<string>",
            GgufArray::Array(_) => "array<array>",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names() {
        assert_eq!(GgufValue::U32(1).type_name(), "u32");
        assert_eq!(GgufValue::String(String::new()).type_name(), "string");
        let a = GgufArray::String(vec!["a".into()]);
        assert_eq!(a.type_name(), "array<string>");
        assert_eq!(GgufValue::Array(a.clone()).type_name(), "array<string>");
        assert_eq!(GgufArray::Array(vec![a]).type_name(), "array<array>");
        assert!(GgufArray::F32(vec![]).is_empty());
    }
}
