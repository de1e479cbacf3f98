//! Shared by the `process` and `api` test binaries; each uses part of it.
#![allow(dead_code)]
//! Real processes for the tests: `redis-server` (unix socket, TCP, TLS) and
//! the `turnstore` binary. Each is killed and reaped on drop; their logs go
//! into failure messages.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tempfile::TempDir;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A local port that refuses connections for as long as this lives: bound
/// but never listening, so no other test's server can take it and no
/// outgoing connection can pick it as its own port (connecting to a port
/// [`free_port`] gave back can reach whatever took it since, or the
/// connection itself).
pub struct ClosedPort {
    _socket: tokio::net::TcpSocket,
    port: u16,
}

impl ClosedPort {
    pub fn new() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = socket.local_addr().unwrap().port();
        Self {
            _socket: socket,
            port,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

fn wait_until(
    what: &str,
    timeout: Duration,
    mut ok: impl FnMut() -> bool,
    log: impl Fn() -> String,
) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen in {timeout:?}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A CA and a `localhost` server certificate signed by it, as PEM files.
pub struct TestCa {
    dir: TempDir,
}

impl TestCa {
    pub fn new() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "turnstore test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let server_key = KeyPair::generate().unwrap();
        let server_params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();

        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca_cert.pem()).unwrap();
        std::fs::write(dir.path().join("server.pem"), server_cert.pem()).unwrap();
        std::fs::write(dir.path().join("server.key"), server_key.serialize_pem()).unwrap();
        TestCa { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    pub fn ca_path(&self) -> String {
        self.path("ca.pem")
    }
}

enum Addr {
    Unix(PathBuf),
    Tcp(u16),
    Tls(u16),
}

/// A `redis-server` of the test's own.
pub struct Redis {
    child: Child,
    dir: TempDir,
    addr: Addr,
    password: Option<String>,
    args: Vec<String>,
}

impl Redis {
    /// Starts one on `addr`; a port another process took meanwhile (a
    /// free port is only free when asked; a cluster's bus port, the port
    /// plus 10000, was never asked) is replaced by another, a few times.
    fn start(
        addr: impl Fn(&std::path::Path) -> Addr,
        extra: &[String],
        password: Option<String>,
    ) -> Self {
        for _ in 0..4 {
            match Self::try_start(&addr, extra, password.clone()) {
                Ok(redis) => return redis,
                Err(log) => eprintln!("redis-server lost its port; again\n{log}"),
            }
        }
        match Self::try_start(&addr, extra, password) {
            Ok(redis) => redis,
            Err(log) => panic!("redis-server would not start\n{log}"),
        }
    }

    /// Err: it exited as its port was in use (its log).
    fn try_start(
        addr: &impl Fn(&std::path::Path) -> Addr,
        extra: &[String],
        password: Option<String>,
    ) -> Result<Self, String> {
        let dir = tempfile::tempdir().unwrap();
        let addr = addr(dir.path());
        let mut args: Vec<String> = vec![
            "--save".into(),
            "".into(),
            "--appendonly".into(),
            "no".into(),
            "--dir".into(),
            dir.path().display().to_string(),
            "--logfile".into(),
            dir.path().join("redis.log").display().to_string(),
        ];
        match &addr {
            Addr::Unix(path) => args.extend([
                "--port".into(),
                "0".into(),
                "--unixsocket".into(),
                path.display().to_string(),
            ]),
            Addr::Tcp(port) => args.extend([
                "--port".into(),
                port.to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
            ]),
            Addr::Tls(port) => args.extend([
                "--port".into(),
                "0".into(),
                "--tls-port".into(),
                port.to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
            ]),
        }
        args.extend(extra.iter().cloned());
        let mut redis = Redis {
            child: spawn_redis(&args),
            dir,
            addr,
            password,
            args,
        };
        redis.wait_ready(0)?;
        Ok(redis)
    }

    /// Waits for the `before + 1`th "ready" line of the log; Err (the log)
    /// if the server exited as its port was in use.
    fn wait_ready(&mut self, before: usize) -> Result<(), String> {
        let marker = "ready to accept connections";
        let path = self.dir.path().join("redis.log");
        let log = || std::fs::read_to_string(&path).unwrap_or_default();
        let child = &mut self.child;
        let mut lost = false;
        wait_until(
            "redis-server answering",
            Duration::from_secs(10),
            || {
                let log = log();
                lost = log.contains("Address already in use")
                    && child.try_wait().ok().flatten().is_some();
                lost || log.to_lowercase().matches(marker).count() > before
            },
            log,
        );
        if lost { Err(self.log()) } else { Ok(()) }
    }

    /// Stops the server (its data is gone: no persistence).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same address.
    pub fn restart(&mut self) {
        self.stop();
        let before = self
            .log()
            .to_lowercase()
            .matches("ready to accept connections")
            .count();
        self.child = spawn_redis(&self.args);
        self.wait_ready(before).unwrap();
    }

    pub fn unix() -> Self {
        Self::unix_with(&[])
    }

    /// On a unix socket, with more `redis-server` arguments.
    pub fn unix_with(extra: &[&str]) -> Self {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        Self::start(|dir| Addr::Unix(dir.join("redis.sock")), &extra, None)
    }

    /// On a free TCP port; `extra` are more `redis-server` arguments.
    pub fn tcp(extra: &[&str]) -> Self {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let password = extra
            .iter()
            .position(|a| a == "--requirepass")
            .map(|i| extra[i + 1].clone());
        Self::start(|_| Addr::Tcp(free_port()), &extra, password)
    }

    pub fn tls(ca: &TestCa) -> Self {
        Self::tls_with(ca, &[])
    }

    /// TLS only, with more `redis-server` arguments.
    pub fn tls_with(ca: &TestCa, more: &[&str]) -> Self {
        let mut extra = vec![
            "--tls-cert-file".to_string(),
            ca.path("server.pem"),
            "--tls-key-file".to_string(),
            ca.path("server.key"),
            "--tls-ca-cert-file".to_string(),
            ca.path("ca.pem"),
            "--tls-auth-clients".to_string(),
            "no".to_string(),
        ];
        extra.extend(more.iter().map(|s| s.to_string()));
        Self::start(|_| Addr::Tls(free_port()), &extra, None)
    }

    pub fn url(&self) -> String {
        match &self.addr {
            Addr::Unix(path) => format!("redis+unix://{}", path.display()),
            Addr::Tcp(port) => format!("redis://127.0.0.1:{port}"),
            Addr::Tls(port) => format!("rediss://localhost:{port}"),
        }
    }

    pub fn port(&self) -> u16 {
        match self.addr {
            Addr::Tcp(port) | Addr::Tls(port) => port,
            Addr::Unix(_) => panic!("a unix-socket Redis has no port"),
        }
    }

    fn cli_command(&self) -> Command {
        let mut cmd = Command::new("redis-cli");
        match &self.addr {
            Addr::Unix(path) => cmd.arg("-s").arg(path),
            Addr::Tcp(port) | Addr::Tls(port) => cmd.arg("-p").arg(port.to_string()),
        };
        if let Some(pw) = &self.password {
            cmd.env("REDISCLI_AUTH", pw);
        }
        cmd
    }

    pub fn cli(&self, args: &[&str]) -> String {
        let out = self.cli_command().args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn cli_tls(&self, ca: &TestCa, args: &[&str]) -> String {
        let out = self
            .cli_command()
            .args(["--tls", "--cacert", &ca.ca_path(), "-h", "localhost"])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// `redis-cli monitor`, subscribed when this returns: each command the
    /// server runs from then on is one line of [`Monitor::commands`].
    pub fn monitor(&self) -> Monitor {
        let mut child = self
            .cli_command()
            .arg("monitor")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        wait_until(
            "redis-cli monitor subscribed",
            Duration::from_secs(10),
            || lines.lock().unwrap().first().is_some_and(|l| l == "OK"),
            || format!("{:?}", lines.lock().unwrap()),
        );
        Monitor { child, lines }
    }
}

/// A running `redis-cli monitor`.
pub struct Monitor {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Monitor {
    /// The lines seen so far, as redis-cli prints them (after its `OK`).
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().iter().skip(1).cloned().collect()
    }

    /// The commands seen so far, as `(source, NAME)`: the source is `lua`
    /// for a command a script ran, else the client's address.
    pub fn commands(&self) -> Vec<(String, String)> {
        // A line: 1700000000.123456 [0 unix:/tmp/x/redis.sock] "EVALSHA" "..." ...
        self.lines
            .lock()
            .unwrap()
            .iter()
            .skip(1)
            .map(|line| {
                let open = line.find('[').expect("a monitor line has a source");
                let close = open + line[open..].find(']').unwrap();
                let source = line[open + 1..close].split_once(' ').unwrap().1;
                let name = line[close + 1..].trim_start().split('"').nth(1).unwrap();
                (source.to_owned(), name.to_ascii_uppercase())
            })
            .collect()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Redis Cluster of the test's own: masters on free ports, slots spread
/// by `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<Redis>,
}

impl RedisCluster {
    pub fn start(masters: usize) -> Self {
        let nodes: Vec<Redis> = (0..masters)
            .map(|_| Redis::tcp(&["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]))
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port()));
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap();
        let cluster = RedisCluster { nodes };
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            cluster.log()
        );
        wait_until(
            "the cluster to agree",
            Duration::from_secs(20),
            || {
                cluster
                    .nodes
                    .iter()
                    .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
            },
            || cluster.log(),
        );
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Redis::url).collect()
    }

    pub fn keyslot(&self, key: &str) -> u16 {
        self.nodes[0]
            .cli(&["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .unwrap()
    }

    fn node_id(&self, i: usize) -> String {
        self.nodes[i].cli(&["CLUSTER", "MYID"]).trim().to_owned()
    }

    /// Which node serves `slot`, per the first node's view.
    pub fn owner(&self, slot: u16) -> usize {
        let nodes = self.nodes[0].cli(&["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let serves = fields.iter().skip(8).any(|range| {
                let mut ends = range.split('-').map(|n| n.parse::<u16>());
                match (ends.next(), ends.next()) {
                    (Some(Ok(a)), Some(Ok(b))) => (a..=b).contains(&slot),
                    (Some(Ok(a)), None) => a == slot,
                    _ => false,
                }
            });
            if serves {
                return (0..self.nodes.len())
                    .find(|i| self.node_id(*i) == fields[0])
                    .unwrap();
            }
        }
        panic!("no node serves slot {slot}:\n{nodes}");
    }

    /// Moves `slot` and its keys to node `to`, as `redis-cli --cluster
    /// reshard` does: IMPORTING/MIGRATING, MIGRATE in batches, then NODE.
    pub fn migrate_slot(&self, slot: u16, to: usize) {
        let from = self.owner(slot);
        let (from_id, to_id) = (self.node_id(from), self.node_id(to));
        let slot_s = slot.to_string();
        self.nodes[to].cli(&["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &from_id]);
        self.nodes[from].cli(&["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &to_id]);
        loop {
            let keys = self.nodes[from].cli(&["CLUSTER", "GETKEYSINSLOT", &slot_s, "2"]);
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let port = self.nodes[to].port().to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().copied());
            let out = self.nodes[from].cli(&args);
            assert!(
                out.contains("OK") || out.contains("NOKEY"),
                "MIGRATE: {out}"
            );
            std::thread::sleep(Duration::from_millis(30));
        }
        for node in &self.nodes {
            node.cli(&["CLUSTER", "SETSLOT", &slot_s, "NODE", &to_id]);
        }
    }

    pub fn log(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- node {} ---\n{}", n.port(), n.log()))
            .collect()
    }
}

fn spawn_redis(args: &[String]) -> Child {
    Command::new("redis-server")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (scripts/test installs it)")
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- redis-server log ---\n{}", self.log());
        }
    }
}

/// Debian's nginx as a round-robin load balancer in front of `upstreams`.
pub struct Nginx {
    child: Child,
    dir: TempDir,
    pub port: u16,
}

impl Nginx {
    /// Spreads requests over `upstreams`, as a load balancer in front of
    /// several instances.
    pub fn balance(upstreams: &[String]) -> Self {
        Nginx::start(upstreams, "/", "http://turnstore")
    }

    /// Serves `upstream` under `prefix` (`/turnstore`), which it strips:
    /// `{prefix}/docs` is the upstream's `/docs`.
    pub fn under_prefix(upstream: &str, prefix: &str) -> Self {
        Nginx::start(
            &[upstream.to_owned()],
            &format!("{prefix}/"),
            "http://turnstore/",
        )
    }

    fn start(upstreams: &[String], location: &str, pass: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let d = dir.path().display();
        let servers: String = upstreams
            .iter()
            .map(|u| format!("        server {u} max_fails=1 fail_timeout=10s;\n"))
            .collect();
        let conf = format!(
            "daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n    access_log off;\n    client_body_temp_path {d}/body;\n    proxy_temp_path {d}/proxy;\n\
                 fastcgi_temp_path {d}/fcgi;\n    uwsgi_temp_path {d}/uwsgi;\n    scgi_temp_path {d}/scgi;\n\
                 upstream turnstore {{\n{servers}        keepalive 32;\n    }}\n\
                 server {{\n        listen 127.0.0.1:{port};\n        location {location} {{\n\
                     proxy_pass {pass};\n            proxy_http_version 1.1;\n\
                     proxy_set_header Connection \"\";\n            proxy_next_upstream error timeout;\n\
                     proxy_connect_timeout 1s;\n            proxy_read_timeout 10s;\n        }}\n    }}\n}}\n"
        );
        std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
        let child = Command::new("nginx")
            .arg("-c")
            .arg(dir.path().join("nginx.conf"))
            .arg("-p")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx must be installed (scripts/test installs it)");
        let nginx = Nginx { child, dir, port };
        wait_until(
            "nginx listening",
            Duration::from_secs(10),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
            || nginx.log(),
        );
        nginx
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- nginx error log ---\n{}", self.log());
        }
    }
}

/// The `turnstore` binary, serving on a free port.
pub struct Turnstore {
    child: Child,
    log: Arc<Mutex<String>>,
    port: u16,
}

impl Turnstore {
    pub fn spawn(env: &[(&str, String)]) -> Self {
        Self::spawn_with_file_limit(env, None)
    }

    /// Spawned under `ulimit -n <files>` (soft and hard) when given.
    pub fn spawn_with_file_limit(env: &[(&str, String)], files: Option<u32>) -> Self {
        let bin = env!("CARGO_BIN_EXE_turnstore");
        let mut cmd = match files {
            None => Command::new(bin),
            Some(n) => {
                let mut sh = Command::new("sh");
                sh.args(["-c", &format!("ulimit -n {n} && exec \"$0\""), bin]);
                sh
            }
        };
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("TURNSTORE_LISTEN", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let mut log = log.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
                }
            });
        }
        let mut ts = Turnstore {
            child,
            log,
            port: 0,
        };
        let read_port = |log: &str| {
            let line = log.lines().find(|l| l.contains("turnstore serving"))?;
            let at = line
                .find("port=")
                .map(|i| i + 5)
                .or_else(|| line.find("\"port\":").map(|i| i + 7))?;
            line[at..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .ok()
        };
        let log = ts.log.clone();
        wait_until(
            "turnstore serving",
            Duration::from_secs(20),
            || read_port(&log.lock().unwrap()).is_some(),
            || ts.log(),
        );
        ts.port = read_port(&ts.log()).unwrap();
        ts
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn listen(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Its `/metrics` page, as Prometheus scrapes it.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.base()))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// CPU time the process has used so far (user and system), from
    /// `/proc/<pid>/stat`.
    pub fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        // After the command's name in parentheses: state is field 3, utime 14.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = rest.split(' ').collect();
        let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
        // SAFETY: sysconf only reads a constant of the system.
        ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
    }

    /// Kills the process outright, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn sigterm(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "could not signal turnstore");
    }

    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Let the reader threads take the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "turnstore did not exit\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs the binary once more with other arguments (e.g. `healthcheck`).
    pub fn run(&self, args: &[&str], env: &[(&str, String)]) -> ExitStatus {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_turnstore"));
        cmd.env_clear().args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.status().unwrap()
    }
}

impl Drop for Turnstore {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- turnstore log ---\n{}", self.log());
        }
    }
}
