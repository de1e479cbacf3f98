//! The command line: `turnstore [serve]`, `turnstore openapi`, `migrate`,
//! `healthcheck` and `redact`.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::app::Application;
use crate::config::{LogFormat, Settings};
use crate::server::threads::Threads;
use crate::telemetry;

#[derive(Debug, Parser)]
#[command(
    name = "turnstore",
    version,
    about = "Conversation history for LLM and RAG backends"
)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: Settings,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP API (the default).
    Serve(Box<Settings>),
    /// Print the OpenAPI document.
    Openapi,
    /// Bring the Redis data to this build's layout (see migrations/);
    /// resumable, and a no-op when it is current.
    Migrate(Box<Settings>),
    /// Mask secrets in standard input (the lens's rules: the built-in ones
    /// and `TURNSTORE_REDACT_PATTERNS`'), to standard output; `masked N`
    /// on standard error.
    Redact {
        #[arg(long, env = "TURNSTORE_REDACT_PATTERNS")]
        redact_patterns: Option<std::path::PathBuf>,
    },
    /// Exit 0 if the server on the listen address answers `/healthz` with
    /// 200 (for container health checks, without curl in the image).
    Healthcheck {
        #[arg(long, env = "TURNSTORE_LISTEN", default_value = crate::config::DEFAULT_LISTEN)]
        listen: SocketAddr,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Openapi) => {
            println!("{}", crate::openapi_json());
            ExitCode::SUCCESS
        }
        Some(Command::Healthcheck { listen }) => match healthcheck(listen) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("unhealthy: {e}");
                ExitCode::FAILURE
            }
        },
        Some(Command::Redact { redact_patterns }) => redact(redact_patterns.as_deref()),
        Some(Command::Serve(settings)) => serve(*settings),
        Some(Command::Migrate(settings)) => migrate(*settings),
        None => serve(cli.serve),
    }
}

fn redact(rules: Option<&std::path::Path>) -> ExitCode {
    let redactor = match crate::redact::Redactor::load(rules) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot load the redaction rules: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut text = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut text) {
        eprintln!("cannot read standard input (UTF-8 text): {e}");
        return ExitCode::FAILURE;
    }
    let out = redactor.redact(&text);
    let mut stdout = std::io::stdout().lock();
    if stdout
        .write_all(out.text.as_bytes())
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    eprintln!("masked {}", out.masked);
    ExitCode::SUCCESS
}

fn serve(settings: Settings) -> ExitCode {
    if let Err(e) = init_logging(&settings) {
        eprintln!("turnstore: cannot export traces: {e}");
        return ExitCode::FAILURE;
    }
    // A runtime per thread, each serving the connections handed to it (see
    // server::threads); at most one per core: more would only take turns
    // on the cores, each woken for its own connections (on 2 cores, 16
    // such threads cost 1.56x the CPU a question of 2).
    let cores = crate::server::threads::cores();
    let count = match settings.worker_threads {
        0 => cores,
        n if n > cores => {
            tracing::info!(
                configured = n,
                cores,
                "TURNSTORE_WORKER_THREADS lowered to one thread per core"
            );
            cores
        }
        n => n,
    };
    let Threads {
        main: runtime,
        handles,
    } = match Threads::start(count) {
        Ok(threads) => threads,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async move {
        let store = if !settings.redis_cluster_nodes.is_empty() {
            "redis-cluster"
        } else if settings.redis_url.is_some() {
            "redis"
        } else {
            "memory"
        };
        let app = match Application::build(settings.clone()).await {
            Ok(app) => app.serve_on(handles),
            Err(e) => {
                tracing::error!(error = %e, "cannot start");
                eprintln!("turnstore: cannot start: {e}");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(listen = %settings.listen, port = app.port(), store, threads = count, "turnstore serving");
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
    });
    telemetry::flush();
    code
}

fn migrate(settings: Settings) -> ExitCode {
    if let Err(e) = init_logging(&settings) {
        eprintln!("turnstore migrate: cannot export traces: {e}");
        return ExitCode::FAILURE;
    }
    if settings.redis_url.is_none() && settings.redis_cluster_nodes.is_empty() {
        eprintln!("turnstore migrate: set TURNSTORE_REDIS_URL or TURNSTORE_REDIS_CLUSTER_NODES");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("turnstore migrate: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async move {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let metrics = crate::metrics::Metrics::new();
        let store = match crate::app::redis_store(&settings, &metrics) {
            Ok(store) => store,
            Err(e) => {
                eprintln!("turnstore migrate: {e}");
                return ExitCode::FAILURE;
            }
        };
        match store
            .migrate(|step| eprintln!("turnstore migrate: {step}"))
            .await
        {
            Ok(r) => {
                for s in &r.steps {
                    println!(
                        "{}: {} sessions, {} {}, {} conflicts",
                        s.name, s.sessions, s.changes.0, s.changes.1, s.conflicts
                    );
                }
                println!("layout {} -> {}", r.from, r.to);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("turnstore migrate: {e}");
                ExitCode::FAILURE
            }
        }
    });
    telemetry::flush();
    code
}

/// The log's subscriber, and the trace exporter's layer when an endpoint is
/// set (`Err`: the exporter cannot be made). Without one, exactly the
/// subscriber it always was.
fn init_logging(settings: &Settings) -> Result<(), String> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let Some(endpoint) = telemetry::endpoint(settings.otlp_endpoint.as_deref()) else {
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(ansi);
        match settings.log_format {
            LogFormat::Json => builder
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .init(),
            LogFormat::Text => builder.init(),
        }
        return Ok(());
    };
    let log = tracing_subscriber::fmt::layer().with_ansi(ansi);
    let log = match settings.log_format {
        LogFormat::Json => log
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .boxed(),
        LogFormat::Text => log.boxed(),
    };
    // The log's filter is the log's alone: `RUST_LOG=warn` keeps traces.
    let origin = endpoint.origin();
    let traces = telemetry::layer(endpoint)?;
    tracing_subscriber::registry()
        .with(log.with_filter(filter))
        .with(traces)
        .init();
    // The exporter reports nothing of its own (failed sends, spans dropped
    // when the collector lags): this line says where spans should arrive.
    tracing::info!(collector = %origin, "exporting traces");
    Ok(())
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

fn healthcheck(mut addr: SocketAddr) -> std::io::Result<()> {
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    let timeout = Duration::from_secs(2);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head)?;
    if head.starts_with(b"HTTP/1.") && &head[8..] == b" 200" {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "answered {}",
            String::from_utf8_lossy(&head)
        )))
    }
}
