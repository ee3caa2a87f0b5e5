//! The `emberlm` command-line tool (native only; on wasm32 this compiles to an empty program).

#[cfg(not(target_arch = "wasm32"))]
mod cli {
    use clap::{Parser, Subcommand};
    use emberlm::{GpuContext, GpuOptions};

    /// Run large language models on the GPU through wgpu.
    #[derive(Debug, Parser)]
    #[command(name = "emberlm", version, about)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Debug, Subcommand)]
    enum Command {
        /// Describe the GPU adapter and device emberlm would use.
        Adapter {
            /// Print JSON instead of text.
            #[arg(long)]
            json: bool,
            /// Do not request the `subgroups` feature.
            #[arg(long)]
            no_subgroups: bool,
        },
    }

    pub fn main() -> std::process::ExitCode {
        let cli = Cli::parse();
        match run(cli) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("emberlm: {e}");
                std::process::ExitCode::from(1)
            }
        }
    }

    fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
        match cli.command {
            Command::Adapter { json, no_subgroups } => {
                let options = GpuOptions {
                    allow_subgroups: !no_subgroups,
                    ..GpuOptions::default()
                };
                let ctx = pollster::block_on(GpuContext::new(options))?;
                let report = ctx.report();
                if json {
                    println!("{}", serde_json::to_string_pretty(report)?);
                } else {
                    println!("adapter:   {}", report.name);
                    println!("backend:   {} ({})", report.backend, report.device_type);
                    println!("driver:    {} {}", report.driver, report.driver_info);
                    println!(
                        "subgroups: {} (sizes {}..={})",
                        report.subgroups, report.subgroup_min_size, report.subgroup_max_size
                    );
                    println!("shader-f16: {}", report.shader_f16);
                    println!(
                        "max storage binding: {} bytes, max buffer: {} bytes",
                        report.limits.max_storage_buffer_binding_size,
                        report.limits.max_buffer_size
                    );
                    println!("features:  {}", report.device_features.join(", "));
                }
                Ok(())
            }
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn main() -> std::process::ExitCode {
    cli::main()
}

#[cfg(target_arch = "wasm32")]
fn main() {}
