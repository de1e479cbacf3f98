//! The command line: `turnstore [serve]` and `turnstore openapi`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use crate::app::Application;
use crate::config::{LogFormat, Settings};

#[derive(Debug, Parser)]
#[command(
    name = "turnstore",
    version,
    about = "Conversation history for LLM and RAG backends"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: Settings,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP API (the default).
    Serve(Settings),
    /// Print the OpenAPI document.
    Openapi,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Openapi) => {
            println!("{}", crate::openapi_json());
            ExitCode::SUCCESS
        }
        Some(Command::Serve(settings)) => serve(settings),
        None => serve(cli.serve),
    }
}

fn serve(settings: Settings) -> ExitCode {
    init_logging(settings.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        if settings.api_keys.iter().all(String::is_empty) {
            tracing::warn!(
                "TURNSTORE_API_KEYS is not set: the API is open to anyone who can reach it"
            );
        }
        let store = if settings.redis_url.is_some() {
            "redis"
        } else {
            "memory"
        };
        let app = match Application::build(settings.clone()).await {
            Ok(app) => app,
            Err(e) => {
                tracing::error!(error = %e, "cannot start");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(listen = %settings.listen, port = app.port(), store, "turnstore serving");
        match app.run_until_stopped(shutdown_signal()).await {
            Ok(()) => {
                tracing::info!("stopped");
                ExitCode::SUCCESS
            }
            Err(e) => {
                tracing::error!(error = %e, "server failed");
                ExitCode::FAILURE
            }
        }
    })
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .init(),
        LogFormat::Text => builder.init(),
    }
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutting down: finishing requests in flight");
}
