//! Building and running the service: `Application::build(settings)` binds the
//! listener and picks the store; `run_until_stopped(shutdown)` serves.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::Settings;
use crate::http::{AppState, router};
use crate::store::{Limits, MemoryStore, RedisStore, Store};

pub type BuildError = Box<dyn std::error::Error + Send + Sync>;

pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    port: u16,
}

impl Application {
    /// Must run inside a Tokio runtime.
    pub async fn build(settings: Settings) -> Result<Self, BuildError> {
        // Build the default encoder now, not on the first request.
        settings.encoding.warm_up();
        let store = build_store(&settings)?;
        let listener = TcpListener::bind(settings.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", settings.listen))?;
        let port = listener.local_addr()?.port();
        let router = router(AppState::new(store, settings));
        Ok(Application {
            listener,
            router,
            port,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Serves until `shutdown` completes, then finishes the requests in flight.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await
    }
}

pub fn build_store(settings: &Settings) -> Result<Arc<dyn Store>, BuildError> {
    let limits = Limits {
        session_ttl: settings.session_ttl,
        pending_ttl: settings.pending_ttl,
        max_turns: settings.max_turns,
    };
    Ok(match &settings.redis_url {
        None => Arc::new(MemoryStore::new(limits)),
        Some(url) => Arc::new(RedisStore::new(
            crate::store::redis::RedisOptions {
                url: url.clone(),
                key_prefix: settings.key_prefix.clone(),
                pool_size: settings.redis_pool_size as usize,
                timeout: settings.store_timeout,
            },
            limits,
        )?),
    })
}
