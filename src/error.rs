//! The crate's single error type: every failure a caller can see is one of these variants.

use thiserror::Error;

/// Shorthand for `Result<T, emberlm::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in emberlm, with enough context to act on.
#[derive(Debug, Clone, Error)]
pub enum Error {
    /// No GPU adapter matched the request (no WebGPU in this browser, no Vulkan driver, ...).
    #[error("no GPU adapter available: {0}")]
    NoAdapter(String),

    /// The adapter refused to create a device with the requested features and limits.
    #[error("could not create a GPU device on `{adapter}`: {message}")]
    RequestDevice {
        /// Name of the adapter that refused.
        adapter: String,
        /// The driver's or browser's reason.
        message: String,
    },

    /// The GPU device was lost (driver reset, tab backgrounded too long, `device.destroy()`).
    /// The context is unusable; create a new one.
    #[error("GPU device lost ({reason}): {message}")]
    DeviceLost {
        /// `destroyed` or `unknown`, as reported by the backend.
        reason: String,
        /// The backend's message.
        message: String,
    },

    /// A GPU error that no error scope captured (validation, out of memory, internal).
    #[error("GPU {kind} error: {message}")]
    Gpu {
        /// `validation`, `out-of-memory` or `internal`.
        kind: &'static str,
        /// The backend's message.
        message: String,
    },

    /// The GPU had no memory for a load's buffers (a `GPUOutOfMemoryError` caught by an error
    /// scope around the allocations of `what`). Every buffer the load had made is dropped
    /// with the error, so the device stays usable for a smaller model or a shorter context.
    #[error(
        "the GPU ran out of memory allocating {what} ({allocated} bytes of this load's buffers \
         had been made; they are freed): {message}. Try a smaller or more strongly quantized \
         model, a shorter context, or a smaller KV cache type"
    )]
    OutOfMemory {
        /// What was being allocated (`tensor `blk.3.ffn_up.weight``, `the KV cache of 4096
        /// positions`, `the activations for 512-token steps`).
        what: String,
        /// Bytes of GPU buffers this load had created when the error was caught.
        allocated: u64,
        /// The backend's message.
        message: String,
    },

    /// A WGSL kernel failed to preprocess, compile or link into a pipeline.
    #[error("shader `{file}` entry point `{entry}`: {message}")]
    Shader {
        /// Shader file name under `shaders/`.
        file: String,
        /// Entry point.
        entry: String,
        /// Compiler or preprocessor message.
        message: String,
    },

    /// Reading a buffer back from the GPU failed or timed out.
    #[error("GPU readback of `{buffer}` failed: {message}")]
    Readback {
        /// Label of the buffer being read.
        buffer: String,
        /// What went wrong.
        message: String,
    },

    /// A request exceeds one of the device's limits; nothing was allocated.
    #[error("`{what}` needs {needed} but the device limit `{limit}` is {allowed}")]
    Limit {
        /// What was being created (buffer label, dispatch, ...).
        what: String,
        /// Name of the WebGPU limit.
        limit: &'static str,
        /// The amount requested.
        needed: u64,
        /// The device's limit.
        allowed: u64,
    },

    /// A model file (GGUF, safetensors, config.json, tokenizer.json, ...) is malformed, truncated
    /// or inconsistent. `message` names the field, tensor, offset or limit involved.
    #[error("{file}: {message}")]
    Format {
        /// The file (or input) name.
        file: String,
        /// What is wrong, and where.
        message: String,
    },

    /// A file is well formed but uses something emberlm does not implement (a tensor type, an
    /// architecture, a tokenizer model).
    #[error("{file}: unsupported {what}")]
    Unsupported {
        /// The file (or input) name.
        file: String,
        /// What is unsupported, e.g. "tensor type IQ2_XS (16) in tensor `blk.0.attn_q.weight`".
        what: String,
    },

    /// Reading a file failed.
    #[error("cannot read `{path}`: {message}")]
    Io {
        /// The path.
        path: String,
        /// The operating system's message.
        message: String,
    },

    /// Storing a download would not fit the storage the browser grants this origin; nothing
    /// was written.
    #[error("`{what}` needs {needed} bytes of storage but {free} are free (quota {quota} bytes, {used} used)")]
    Quota {
        /// What was to be stored (the file and its store).
        what: String,
        /// Bytes still to store.
        needed: u64,
        /// Bytes free: the quota less what is used.
        free: u64,
        /// The origin's quota (`navigator.storage.estimate()`).
        quota: u64,
        /// Bytes the origin uses already.
        used: u64,
    },

    /// Building or running the tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// Parsing or rendering a chat template failed.
    #[error("chat template: {0}")]
    Template(String),

    /// A caller-supplied argument is out of range or inconsistent.
    #[error("invalid argument `{name}`: {message}")]
    InvalidArgument {
        /// Parameter name.
        name: &'static str,
        /// Why it is invalid, including the allowed range.
        message: String,
    },

    /// A request was cancelled before it ran, or the engine was closed.
    #[error("cancelled: {0}")]
    Cancelled(String),
}

impl Error {
    /// Builds an [`Error::Format`].
    pub fn format(file: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Format {
            file: file.into(),
            message: message.into(),
        }
    }

    /// The variant's name (`DeviceLost`, `Limit`, `Format`, `InvalidArgument`, ...), a stable
    /// tag for callers that react to the kind of failure (the JavaScript API starts its error
    /// messages with it).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::NoAdapter(_) => "NoAdapter",
            Error::RequestDevice { .. } => "RequestDevice",
            Error::DeviceLost { .. } => "DeviceLost",
            Error::Gpu { .. } => "Gpu",
            Error::OutOfMemory { .. } => "OutOfMemory",
            Error::Shader { .. } => "Shader",
            Error::Readback { .. } => "Readback",
            Error::Limit { .. } => "Limit",
            Error::Format { .. } => "Format",
            Error::Unsupported { .. } => "Unsupported",
            Error::Io { .. } => "Io",
            Error::Quota { .. } => "Quota",
            Error::Tokenizer(_) => "Tokenizer",
            Error::Template(_) => "Template",
            Error::InvalidArgument { .. } => "InvalidArgument",
            Error::Cancelled(_) => "Cancelled",
        }
    }

    /// Builds an [`Error::InvalidArgument`].
    pub fn invalid(name: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            name,
            message: message.into(),
        }
    }
}
