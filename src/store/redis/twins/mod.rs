//! Each rule the Redis store keeps in Lua against its Rust twin, run side
//! by side over random inputs on a redis-server of the test's own: the
//! budget (`walk`) and the rules both stores share (`rules`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod rules;
mod walk;

/// A redis-server of its own, on a unix socket.
pub(super) struct Server {
    child: Child,
    _dir: tempfile::TempDir,
    socket: PathBuf,
}

impl Server {
    pub(super) fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("redis.sock");
        let child = Command::new("redis-server")
            .args(["--port", "0", "--save", "", "--appendonly", "no"])
            .arg("--unixsocket")
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server runs (scripts/test installs it)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Server {
            child,
            _dir: dir,
            socket,
        }
    }

    pub(super) fn connect(&self) -> redis::Connection {
        let url = format!("unix://{}", self.socket.display());
        redis::Client::open(url).unwrap().get_connection().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
