//! Building and running the service: `Application::build(settings)` binds the
//! listener and picks the store; `run_until_stopped(shutdown)` serves.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::config::Settings;
use crate::http::{AppState, router};
use crate::metrics::Metrics;
use crate::store::{Limits, MemoryStore, Metered, RedisStore, Store};

pub type BuildError = Box<dyn std::error::Error + Send + Sync>;

pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    port: u16,
    shutdown_timeout: Duration,
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
        if api_keys.is_empty() {
            tracing::warn!(
                "no API keys configured (TURNSTORE_API_KEYS, TURNSTORE_API_KEYS_FILE): the API is open to anyone who can reach it"
            );
        }
        let metrics = Arc::new(Metrics::new());
        let store = Arc::new(Metered::new(
            build_store(&settings, &metrics)?,
            metrics.clone(),
        ));
        let listener = TcpListener::bind(settings.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", settings.listen))?;
        let port = listener.local_addr()?.port();
        let shutdown_timeout = settings.shutdown_timeout;
        let router = router(AppState::new(store, settings, &api_keys, metrics));
        Ok(Application {
            listener,
            router,
            port,
            shutdown_timeout,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Serves until `shutdown` completes; then stops accepting and lets the
    /// requests in flight finish, for at most the shutdown timeout.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
        let server = axum::serve(self.listener, self.router).with_graceful_shutdown(async move {
            shutdown.await;
            let _ = stopping_tx.send(());
        });
        let deadline = async move {
            if stopping_rx.await.is_ok() {
                tokio::time::sleep(self.shutdown_timeout).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            result = server => result,
            () = deadline => {
                tracing::warn!("shutdown timeout passed: dropping the requests still in flight");
                Ok(())
            }
        }
    }
}

pub fn build_store(settings: &Settings, metrics: &Metrics) -> Result<Arc<dyn Store>, BuildError> {
    let limits = Limits {
        session_ttl: settings.session_ttl,
        pending_ttl: settings.pending_ttl,
        max_turns: settings.max_turns,
    };
    let cluster = !settings.redis_cluster_nodes.is_empty();
    Ok(match &settings.redis_url {
        None if !cluster => Arc::new(MemoryStore::new(limits, metrics.expired_pending.clone())),
        url => Arc::new(RedisStore::new(
            crate::store::redis::RedisOptions {
                url: url.clone().unwrap_or_default(),
                cluster_nodes: settings.redis_cluster_nodes.clone(),
                ca_pem: match &settings.redis_ca_file {
                    None => None,
                    Some(path) => Some(std::fs::read(path).map_err(|e| {
                        format!(
                            "cannot read TURNSTORE_REDIS_CA_FILE {}: {e}",
                            path.display()
                        )
                    })?),
                },
                expired_pending: metrics.expired_pending.clone(),
                key_prefix: settings.key_prefix.clone(),
                pool_size: settings.redis_pool_size as usize,
                timeout: settings.store_timeout,
            },
            limits,
        )?),
    })
}
