//! What a load from URLs learns before downloading: each file's header, read by HTTP range
//! ([`HttpSource`]), and from it whether the model can run here at all. A context outside the
//! model's, a buffer past the GPU's limits or a model past the wasm32 address space is refused
//! with the numbers before the weights' bytes are asked for, not after gigabytes arrived.

use std::rc::Rc;

use super::http_source::HttpSource;
use crate::backend::gpu::GpuContext;
use crate::engine::EngineOptions;
use crate::error::{Error, Result};
use crate::format::gguf_model::must_read_whole;
use crate::format::gguf_ranged::RangedGguf;
use crate::session::Session;

/// Where the load will run the model, as far as is known before downloading.
pub(super) enum RunsOn<'a> {
    /// On this GPU (`backend: 'gpu'`, or `auto` on a hardware adapter).
    Gpu(&'a GpuContext),
    /// On the CPU backend.
    Cpu,
    /// Either (`auto` on a software adapter times both once the model is here).
    Either,
}

/// Opens `urls` (each with its name) by range and reads their headers; refuses a model that
/// cannot run where `runs_on` says under `options` (a malformed header or an unsupported model
/// is refused here too). `None` where a server does not answer ranges (or fails while its
/// headers are read), or the files must be read whole (a matrix split as the whole file
/// loads): the load then reads them as before and checks after.
pub(super) async fn read_headers(
    urls: &[(String, String)],
    runs_on: RunsOn<'_>,
    options: &EngineOptions,
) -> Result<Option<(Rc<HttpSource>, RangedGguf)>> {
    let Some(http) = HttpSource::open(urls).await else {
        return Ok(None);
    };
    let http = Rc::new(http);
    let ranged = match RangedGguf::open(http.clone(), &http.names()).await {
        Ok(ranged) => ranged,
        Err(e) if must_read_whole(&e) => return Ok(None),
        // the server failed now; the download may still succeed, and says why where not
        Err(Error::Io { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let layout = ranged.layout();
    match runs_on {
        // a KV-cache kind the load plans (`kvCache: 'auto'`) is known only then
        RunsOn::Gpu(gpu) if options.cache_plan.is_none() => {
            Session::check_gpu_fit(gpu, layout, options.context)?;
        }
        RunsOn::Cpu => {
            Session::check_cpu_fit(layout, options.context, options.starting_kinds())?;
        }
        RunsOn::Gpu(_) | RunsOn::Either => {
            if let Some(n) = options.context {
                crate::backend::step::check_context(&layout.config, n)?;
            }
        }
    }
    Ok(Some((http, ranged)))
}
