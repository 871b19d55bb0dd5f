//! One `redis-server` process on a free loopback port.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// A `redis-server` this test started; killed (and its directory removed) on
/// drop.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
}

static NEXT_DIR: AtomicU32 = AtomicU32::new(0);

/// A port that was free a moment ago (and, for a cluster node, whose bus port,
/// `port + 10000`, was too).
pub fn free_port(with_bus: bool) -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().unwrap().port();
        if !with_bus {
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

fn redis_server_binary() -> &'static str {
    if Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        panic!(
            "redis-server is not installed: scripts/test-all installs it \
             (apt-get install -y redis-server)"
        );
    }
    "redis-server"
}

impl RedisServer {
    /// A fresh server with no persistence.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// A fresh server with extra `redis-server` arguments (`--appendonly yes`, ...).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        for _ in 0..5 {
            let dir = std::env::temp_dir().join(format!(
                "tollgate-redis-{}-{}",
                std::process::id(),
                NEXT_DIR.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).expect("a temporary directory");
            let mut server = RedisServer {
                port: free_port(extra.contains(&"--cluster-enabled")),
                dir,
                extra: extra.iter().map(|s| s.to_string()).collect(),
                child: None,
            };
            if server.launch() {
                return server;
            }
            // Another process took the port between our probe and the bind.
        }
        panic!("could not start redis-server on a free port");
    }

    /// Starts the process on this server's port and waits for `PING`.
    fn launch(&mut self) -> bool {
        let mut command = Command::new(redis_server_binary());
        command
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--logfile", "redis.log"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = command.spawn().expect("spawn redis-server");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            if self.ping() {
                self.child = Some(child);
                return true;
            }
            sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    fn ping(&self) -> bool {
        if TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            return false;
        }
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// An admin connection (synchronous).
    pub fn admin(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("admin connection")
    }

    /// Runs one command on an admin connection.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut self.admin())
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    /// How often `command` ran (`INFO commandstats`), e.g. `evalsha`.
    pub fn calls(&self, command: &str) -> u64 {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .map(|rest| rest.split(',').next().unwrap().parse().unwrap())
            .unwrap_or(0)
    }

    /// How many script calls the server ran: `FCALL`, and `EVALSHA` / `EVAL`
    /// on a server without Functions (or after `NOSCRIPT`).
    pub fn script_calls(&self) -> u64 {
        self.calls("fcall") + self.calls("evalsha") + self.calls("eval")
    }

    /// Stops the process (as a crash would: SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again on the same port and directory (an AOF file
    /// there is replayed).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.launch() {
            assert!(Instant::now() < deadline, "redis-server did not restart");
            sleep(Duration::from_millis(50));
        }
    }

    /// Freezes the process (SIGSTOP): it accepts nothing and answers nothing.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Thaws a paused process (SIGCONT).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!("kill -{name} {pid}"))
            .status()
            .expect("sh");
        assert!(status.success());
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A paused process must be woken to die promptly.
            let _ = self.signal_quietly("CONT");
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl RedisServer {
    fn signal_quietly(&self, name: &str) -> Option<()> {
        let pid = self.child.as_ref()?.id();
        Command::new("sh")
            .arg("-c")
            .arg(format!("kill -{name} {pid}"))
            .status()
            .ok()
            .map(|_| ())
    }
}
