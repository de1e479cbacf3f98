//! The threads that serve: a single-threaded Tokio runtime on each, every
//! connection served from start to end by the one it was handed to (thread
//! per core). Nothing is stolen between threads, so no thread wakes another
//! to share work: on a small host shared with Redis, those wake-ups were a
//! quarter of the service's CPU. A request's own tasks (and its Redis
//! connection's, see `store::redis::conn`) stay on its thread; counting
//! long texts still runs on the thread's blocking pool.

use std::cell::Cell;
use std::sync::mpsc;

use tokio::runtime::{Builder, Handle, Runtime};

thread_local! {
    /// This thread's place among the serving threads, and their number.
    static PLACE: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

/// The host's cores (at least one): the serving threads are at most as
/// many, and long counts leave one of them free (`tokens::apart`).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Which serving thread this is, and how many there are (`None` off them:
/// in tests that build the application in their own runtime, say).
pub fn place() -> Option<(usize, usize)> {
    PLACE.with(Cell::get)
}

/// The serving threads: this one's runtime, which the caller runs, and a
/// handle to each thread's runtime (this one's first).
pub struct Threads {
    pub main: Runtime,
    pub handles: Vec<Handle>,
}

impl Threads {
    /// `count` threads (at least one): this one, and `count - 1` more that
    /// serve what they are handed until the process exits.
    pub fn start(count: usize) -> std::io::Result<Threads> {
        let count = count.max(1);
        let build = || Builder::new_current_thread().enable_all().build();
        PLACE.with(|p| p.set(Some((0, count))));
        let main = build()?;
        let mut handles = vec![main.handle().clone()];
        for i in 1..count {
            let (tx, rx) = mpsc::channel();
            std::thread::Builder::new()
                .name(format!("turnstore-{i}"))
                .spawn(move || {
                    PLACE.with(|p| p.set(Some((i, count))));
                    match build() {
                        Ok(rt) => {
                            let _ = tx.send(Ok(rt.handle().clone()));
                            rt.block_on(std::future::pending::<()>());
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                })?;
            let handle = rx
                .recv()
                .map_err(|_| std::io::Error::other("a serving thread did not start"))??;
            handles.push(handle);
        }
        Ok(Threads { main, handles })
    }
}
