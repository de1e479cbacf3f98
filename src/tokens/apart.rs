//! Counts of long texts, off the serving threads and a few at a time.
//!
//! Every long count but those of start and finalize (see [`apart`]).
//!
//! A count is CPU-bound: a 4 MiB history in another encoding takes about
//! a quarter of a second, a maximal rendering counted whole in a loaded
//! tokenizer seconds. Run on the blocking pool, it leaves the serving
//! threads free; run a few at a time, it leaves a core to Redis (on the
//! same host, often), to the probes and to the other requests, and bounds
//! the memory counts take (four maximal whole counts at once took the
//! process to 847 MB, `bench/limits`).

use std::pin::Pin;
use std::sync::LazyLock;

use tokio::sync::Semaphore;

/// How many counts run at once: one a core less one, at least one.
static PLACES: LazyLock<Semaphore> =
    LazyLock::new(|| Semaphore::new(crate::server::threads::cores().saturating_sub(1).max(1)));

/// Runs `work` on the blocking pool once a place is free, and holds the
/// place until `work` ends, even when the caller is dropped first (a
/// request's timeout): a count on the blocking pool runs to its end. A
/// panic in `work` is raised again here. The future is boxed: a
/// request's future that may await it holds a pointer, not the wait for
/// a place. (Start and finalize do not count through here: in their
/// handlers it cost the core loop 4%, `bench/compare`, boxed or not.)
pub fn apart<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Pin<Box<dyn Future<Output = T> + Send>> {
    Box::pin(async move {
        // The semaphore is never closed.
        let place = PLACES.acquire().await.ok();
        match tokio::task::spawn_blocking(move || {
            let _place = place;
            work()
        })
        .await
        {
            Ok(done) => done,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => panic!("the runtime shut down during a count"),
        }
    })
}
