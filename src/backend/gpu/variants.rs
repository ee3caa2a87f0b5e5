//! The kernel variants, as data. A variant is a name, the define that selects its body in its
//! family's one shader, and the adapters it is the first guess for; each family with variants
//! declares them in a table of its own here ([`linear`], [`attention`]), with the geometry and
//! the conditions that are its own. The kernels (`ops/linear.rs`, `ops/attention.rs`) build and
//! dispatch from a table's row alone, and the plan ([`super::plan`]) reads the tables and
//! nothing else, so adding a variant touches its family's table, its shader where its body is
//! new, and nothing more (the kernel tests run every row).
//!
//! The tables depend on nothing of the GPU backend but these types, so that the device's
//! options, the plan and the kernels can all read them.

use std::fmt;

use serde::{Serialize, Serializer};

pub mod attention;
pub mod linear;

/// The name of a kernel variant (`workgroup`, `rows`), as `--kernels`, stored plans and
/// reports spell it. Which names a family has is its table's business (see
/// [`super::plan::Family::variants`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Variant(&'static str);

impl Variant {
    /// The GPU shape: invocations cooperate on a row through shared memory (every family
    /// has it).
    pub const WORKGROUP: Variant = Variant("workgroup");
    /// The CPU-adapter shape: each invocation owns whole rows or heads; no barriers (every
    /// family has it).
    pub const ROWS: Variant = Variant("rows");

    /// The variants every family declares (the GPU shape and the CPU-adapter shape): what a
    /// whole plan can be forced to (`--kernels rows`).
    pub const EVERY_FAMILY: [Variant; 2] = [Variant::WORKGROUP, Variant::ROWS];

    /// A variant called `name` (for families' tables).
    pub const fn named(name: &'static str) -> Self {
        Variant(name)
    }

    /// The name used by `--kernels` and in reports.
    pub fn name(self) -> &'static str {
        self.0
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl Serialize for Variant {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

/// The kind of adapter a variant is guessed for before (or without) measuring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterKind {
    /// A GPU (discrete, integrated or virtual).
    Gpu,
    /// A CPU-like adapter (SwiftShader, lavapipe), which runs a workgroup's subgroups as
    /// fibres and switches at every barrier.
    Cpu,
}

impl AdapterKind {
    /// The kind of an adapter that is (`cpu_adapter`) or is not CPU-like.
    pub fn of(cpu_adapter: bool) -> Self {
        if cpu_adapter {
            AdapterKind::Cpu
        } else {
            AdapterKind::Gpu
        }
    }
}

/// One variant of a kernel family, as every family declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VariantSpec {
    /// Its name.
    pub variant: Variant,
    /// The flag that selects its body in the family's shader (`None`: the body without flags).
    pub define: Option<&'static str>,
    /// The adapters it is the guess for while nothing is measured.
    pub guessed_for: AdapterKind,
    /// One line for reports and `--help`.
    pub summary: &'static str,
}

/// The spec of `variant` in `table`, if the family has it.
pub fn find<T>(
    table: &'static [T],
    spec: impl Fn(&T) -> &VariantSpec,
    variant: Variant,
) -> Option<&'static T> {
    table.iter().find(|t| spec(t).variant == variant)
}
