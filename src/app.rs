//! Building and running the service: `Application::build(settings)` binds the
//! listener and picks the store; `run_until_stopped(shutdown)` serves.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::runtime::Handle;

use crate::config::Settings;
use crate::history::template::{COUNT_CACHE_CAPACITY, Caches, Templates};
use crate::http::{AppState, router};
use crate::metrics::Metrics;
use crate::server::{self, ConnLimits};
use crate::store::redis::LayoutError;
use crate::store::{Limits, MemoryStore, Metered, RedisStore, Store};
use crate::summarizer::llm::{LlmClient, LlmConfig, words_within};
use crate::summarizer::{Plan, Summarizer};
use crate::tokens::{Models, Tokenizers};

pub type BuildError = Box<dyn std::error::Error + Send + Sync>;

pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    port: u16,
    shutdown_timeout: Duration,
    connections: ConnLimits,
    metrics: Arc<Metrics>,
    threads: Vec<Handle>,
}

impl Application {
    /// Must run inside a Tokio runtime.
    pub async fn build(settings: Settings) -> Result<Self, BuildError> {
        // rustls needs one process-wide crypto provider for rediss://; an
        // error only means one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        // Build the default encoder now, not on the first request.
        settings.encoding.warm_up();
        let api_keys = settings.all_api_keys()?;
        let caches = Caches::new(
            COUNT_CACHE_CAPACITY,
            settings.template_cache_mb as usize * 1024 * 1024,
        );
        let templates = Templates::load(settings.templates_dir.as_deref())
            .map_err(|e| format!("cannot load a template: {e}"))?
            .with_caches(&caches);
        let tokenizers = Tokenizers::load(settings.tokenizers_dir.as_deref())
            .map_err(|e| format!("cannot load a tokenizer: {e}"))?;
        let models = Models::load(
            settings.models.as_deref(),
            settings.unknown_model,
            &tokenizers,
        )
        .map_err(|e| format!("cannot load the model table: {e}"))?;
        if !models.is_empty() {
            tracing::info!(entries = models.len(), "model table loaded");
        }
        if api_keys.is_empty() {
            tracing::warn!(
                "no API keys configured (TURNSTORE_API_KEYS, TURNSTORE_API_KEYS_FILE): the API is open to anyone who can reach it"
            );
        }
        let mut metrics = Metrics::new();
        metrics.watch_template_caches(caches);
        metrics.report_tokenizers(&tokenizers);
        let metrics = Arc::new(metrics);
        let store = Arc::new(Metered::new(
            build_store(&settings, &metrics).await?,
            metrics.clone(),
        ));
        let listener = TcpListener::bind(settings.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", settings.listen))?;
        let port = listener.local_addr()?.port();
        let shutdown_timeout = settings.shutdown_timeout;
        let max_connections = server::connection_cap(
            settings.max_connections as usize,
            server::raise_file_limit(),
        );
        if max_connections < settings.max_connections as usize {
            tracing::warn!(
                max_connections,
                "TURNSTORE_MAX_CONNECTIONS lowered to what the open file limit allows (less {})",
                server::FILE_RESERVE
            );
        }
        let connections = ConnLimits {
            header_timeout: settings.header_timeout,
            idle_timeout: settings.idle_timeout,
            write_timeout: settings.write_timeout,
            max_connections,
        };
        let summarizer = summarizer(&settings, &store, &metrics)?;
        let lens = crate::http::lens::Page::load(&settings)?;
        let state = AppState::new(
            store,
            settings,
            &api_keys,
            metrics.clone(),
            templates,
            (models, tokenizers),
            (summarizer, lens),
        );
        let router = router(state);
        Ok(Application {
            listener,
            router,
            port,
            shutdown_timeout,
            connections,
            metrics,
            threads: Vec::new(),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Serves each connection on one of these runtimes, in turn (see
    /// `server::threads`), rather than on the one that runs the server.
    pub fn serve_on(mut self, threads: Vec<Handle>) -> Self {
        self.threads = threads;
        self
    }

    /// Serves until `shutdown` completes; then stops accepting and lets the
    /// requests in flight finish, for at most the shutdown timeout.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
        let server = server::serve(
            self.listener,
            self.router,
            self.connections,
            self.metrics,
            self.threads,
            async move {
                shutdown.await;
                let _ = stopping_tx.send(());
            },
        );
        let deadline = async move {
            if stopping_rx.await.is_ok() {
                tokio::time::sleep(self.shutdown_timeout).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = server => Ok(()),
            () = deadline => {
                tracing::warn!("shutdown timeout passed: dropping the requests still in flight");
                Ok(())
            }
        }
    }
}

/// The tokens a summarizer's summary may take: its share of a default
/// history's budget.
fn summary_budget(settings: &Settings) -> u32 {
    let share = u64::from(settings.history_max_tokens) * u64::from(settings.summary_share) / 100;
    u32::try_from(share).unwrap_or(u32::MAX).max(1)
}

/// The server-side summarizer the settings configure, if any.
fn summarizer(
    settings: &Settings,
    store: &Arc<Metered>,
    metrics: &Arc<Metrics>,
) -> Result<Option<Arc<Summarizer>>, BuildError> {
    let Some(url) = &settings.summarizer_url else {
        return Ok(None);
    };
    let model = settings
        .summarizer_model
        .clone()
        .ok_or("TURNSTORE_SUMMARIZER_URL needs TURNSTORE_SUMMARIZER_MODEL")?;
    let mut config = LlmConfig::new(url.clone(), model);
    config.api_key = settings.summarizer_api_key.clone();
    config.timeout = settings.summarizer_timeout;
    config.max_retries = settings.summarizer_max_retries;
    config.max_summary_bytes = settings.max_summary_bytes as usize;
    let max_summary_tokens = summary_budget(settings);
    config.max_summary_words = words_within(config.max_summary_bytes, Some(max_summary_tokens));
    if let Some(path) = &settings.summarizer_prompt_file {
        config.prompt = std::fs::read_to_string(path).map_err(|e| {
            format!(
                "cannot read TURNSTORE_SUMMARIZER_PROMPT_FILE {}: {e}",
                path.display()
            )
        })?;
    }
    let llm = LlmClient::new(config)
        .map_err(|e| format!("TURNSTORE_SUMMARIZER_URL and its settings: {e}"))?;
    let history = crate::history::Options {
        limit: settings.history_limit as usize,
        max_tokens: settings.history_max_tokens,
        max_bytes: settings.max_history_bytes,
        summary: true,
        ..crate::history::Options::everything(settings.encoding)
    };
    let plan = Plan {
        history,
        after_tokens: settings.summarize_after_tokens,
        concurrency: settings.summarizer_concurrency as usize,
        encoding: settings.encoding,
        max_summary_tokens,
    };
    let store: Arc<dyn Store> = store.clone();
    Ok(Some(Arc::new(Summarizer::new(
        llm,
        store,
        metrics.clone(),
        plan,
    ))))
}

/// The store the settings name. A Redis store is first checked for its data
/// layout: a layout this build cannot serve stops the start; an unreachable
/// Redis does not (the service starts unready and checks again before use).
pub async fn build_store(
    settings: &Settings,
    metrics: &Metrics,
) -> Result<Arc<dyn Store>, BuildError> {
    if settings.redis_url.is_none() && settings.redis_cluster_nodes.is_empty() {
        return Ok(Arc::new(MemoryStore::new(
            limits(settings),
            metrics.expired_pending.clone(),
        )));
    }
    let store = redis_store(settings, metrics)?;
    match store.ensure_layout().await {
        Ok(()) => {}
        Err(LayoutError::Store(e)) => {
            let cause = store.explain(e).await;
            tracing::warn!(%cause, "Redis is not usable yet: starting unready (/readyz answers 503 until it is)");
        }
        Err(e) => return Err(e.into()),
    }
    Ok(Arc::new(store))
}

pub fn limits(settings: &Settings) -> Limits {
    Limits {
        session_ttl: settings.session_ttl,
        pending_ttl: settings.pending_ttl,
        max_turns: settings.max_turns,
        max_pending: settings.max_pending_turns,
    }
}

/// The Redis store the settings name, its layout not yet checked.
pub fn redis_store(settings: &Settings, metrics: &Metrics) -> Result<RedisStore, BuildError> {
    let ca_pem = match &settings.redis_ca_file {
        None => None,
        Some(path) => Some(std::fs::read(path).map_err(|e| {
            format!(
                "cannot read TURNSTORE_REDIS_CA_FILE {}: {e}",
                path.display()
            )
        })?),
    };
    let options = crate::store::redis::RedisOptions {
        url: settings.redis_url.clone().unwrap_or_default(),
        cluster_nodes: settings.redis_cluster_nodes.clone(),
        ca_pem,
        expired_pending: metrics.expired_pending.clone(),
        key_prefix: settings.key_prefix.clone(),
        pool_size: match settings.redis_pool_size {
            // One per serving thread (two off them: a test's runtime).
            0 => crate::server::threads::place().map_or(2, |(_, threads)| threads),
            n => n as usize,
        },
        timeout: settings.store_timeout,
    };
    Ok(RedisStore::new(options, limits(settings))?)
}
