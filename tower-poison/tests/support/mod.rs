//! Redis for the tests: the shared server named by `TOWER_POISON_REDIS_URL`
//! (default `redis://127.0.0.1:6379`), and private `redis-server` processes
//! for the restart test.
//!
//! Without a server a Redis test prints why it is skipped and passes, unless
//! `TOWER_POISON_REQUIRE_REDIS=1` (as in CI), which turns the absence into a
//! failure.
//!
//! [`redis_suites!`] runs a suite twice: `single::` on the shared server and
//! `cluster::` on the Redis Cluster whose nodes `TOWER_REDIS_CLUSTER_URLS`
//! lists (`redis://127.0.0.1:7000,redis://127.0.0.1:7001,…`), where a
//! command or script whose keys span two slots is refused (`CROSSSLOT`).
//! Without it the cluster runs are skipped the same way, unless
//! `TOWER_REDIS_REQUIRE_CLUSTER=1` (as in CI).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const URL_VAR: &str = "TOWER_POISON_REDIS_URL";
pub const REQUIRE_VAR: &str = "TOWER_POISON_REQUIRE_REDIS";
pub const CLUSTER_VAR: &str = "TOWER_REDIS_CLUSTER_URLS";
pub const REQUIRE_CLUSTER_VAR: &str = "TOWER_REDIS_REQUIRE_CLUSTER";

/// Where a suite runs.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    /// The shared server.
    Single,
    /// The Redis Cluster named by `TOWER_REDIS_CLUSTER_URLS`.
    Cluster,
}

/// Each named `async fn NAME(url: String)` of the calling test file as two
/// tests: `single::NAME` on the shared server and `cluster::NAME` on the
/// cluster, each skipped (or failed, when required) without its Redis.
#[allow(unused_macros)]
macro_rules! redis_suites {
    ($($name:ident),* $(,)?) => {
        mod single {
            $(
                #[tokio::test]
                async fn $name() {
                    if let Some(url) = crate::support::redis_at(crate::support::Target::Single).await {
                        super::$name(url).await;
                    }
                }
            )*
        }
        mod cluster {
            $(
                #[tokio::test]
                async fn $name() {
                    if let Some(url) = crate::support::redis_at(crate::support::Target::Cluster).await {
                        super::$name(url).await;
                    }
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use redis_suites;

pub fn redis_url() -> String {
    std::env::var(URL_VAR).unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

pub fn required() -> bool {
    std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1")
}

/// Skips the calling test (prints why), or fails it when Redis is required.
pub fn skip(reason: &str) {
    if required() {
        panic!("{reason}; {REQUIRE_VAR}=1 makes this a failure");
    }
    // Straight to the stream, not `eprintln!`: the test harness captures
    // the macros' output of passing tests, and a skip must be seen.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {reason} (start redis-server, or set {URL_VAR}; {REQUIRE_VAR}=1 makes this a failure)"
    );
}

/// Skips the calling cluster test (prints why), or fails it when the
/// cluster is required.
pub fn skip_cluster(reason: &str) {
    if std::env::var(REQUIRE_CLUSTER_VAR).is_ok_and(|v| v == "1") {
        panic!("{reason}; {REQUIRE_CLUSTER_VAR}=1 makes this a failure");
    }
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {reason} (start a Redis Cluster and list its nodes in {CLUSTER_VAR}, as .ci/run does; {REQUIRE_CLUSTER_VAR}=1 makes this a failure)"
    );
}

/// The shared server's URL when it answers `PING`.
pub async fn shared_redis() -> Option<String> {
    redis_at(Target::Single).await
}

/// `target`'s URL (for the cluster, its nodes' URLs, comma-separated) when
/// it answers `PING` through the stores' own connection.
pub async fn redis_at(target: Target) -> Option<String> {
    let (url, skip): (String, fn(&str)) = match target {
        Target::Single => (redis_url(), skip),
        Target::Cluster => match std::env::var(CLUSTER_VAR) {
            Ok(urls) if !urls.is_empty() => (urls, skip_cluster),
            _ => {
                skip_cluster(&format!("{CLUSTER_VAR} is not set"));
                return None;
            }
        },
    };
    let answered = async {
        let mut connection = raw_connection(&url).await.ok()?;
        let pong: String = redis::cmd("PING").query_async(&mut connection).await.ok()?;
        (pong == "PONG").then_some(())
    };
    match tokio::time::timeout(Duration::from_secs(3), answered).await {
        Ok(Some(())) => Some(url),
        _ => {
            skip(&format!("no Redis answers at {url}"));
            None
        }
    }
}

/// A connection of the stores' own kind (one server or a cluster), for
/// looking at keys directly.
pub async fn raw_connection(
    url: &str,
) -> Result<tower_poison::store::RedisConnection, tower_poison::store::StoreError> {
    tower_poison::store::RedisConnectOptions::new()
        .connect(url)
        .await
}

/// A name no other test (or earlier run) uses, so tests run in parallel on
/// one server.
pub fn unique(name: &str) -> String {
    format!(
        "tower-poison-test:{name}:{}:{:016x}",
        std::process::id(),
        fastrand::u64(..)
    )
}

/// The `redis-server` binary on `PATH`.
pub fn redis_server_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    let found = std::env::split_paths(&path)
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| candidate.is_file());
    if found.is_none() {
        skip("no redis-server binary on PATH (apt-get install redis-server)");
    }
    found
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A private `redis-server` with persistence on (append-only file, fsync on
/// every write), in `dir`, on `port`. Killed (SIGKILL) when dropped.
pub struct RedisProcess {
    child: Option<Child>,
    pub port: u16,
}

impl RedisProcess {
    pub fn start(binary: &Path, dir: &Path, port: u16) -> Self {
        let child = Command::new(binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .args(["--save", "", "--protected-mode", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let process = RedisProcess {
            child: Some(child),
            port,
        };
        process.wait_until_up();
        process
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn wait_until_up(&self) {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if ping(self.port) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "redis-server on port {} did not answer within 10 s",
            self.port
        );
    }

    /// SIGKILL: no shutdown, no final flush, as in a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `true` when a server on `port` answers `PING` (spoken raw, so the check
/// needs nothing but a socket).
fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}

/// Deletes every key of the dead-letter queue (or count store) `name` on
/// the shared server when dropped, even when the test panicked, so test
/// runs leave nothing behind. Only for names made by [`unique`].
pub struct Cleanup {
    url: String,
    pattern: String,
}

impl Cleanup {
    /// Cleans up the keys `tower-poison:{name}:*` (every key of one queue
    /// carries its hash tag).
    pub fn queue(url: &str, name: &str) -> Self {
        assert!(
            name.starts_with("tower-poison-test:"),
            "only a test's own queue is cleaned up, not {name:?}"
        );
        Cleanup {
            url: url.to_owned(),
            pattern: format!("tower-poison:{{{name}}}:*"),
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        // A cluster's nodes one by one: each scans only its own keys, and
        // the keys of one queue share a slot, so one `DEL` takes them.
        for node in self.url.split(',') {
            clean_node(node, &self.pattern);
        }
    }
}

fn clean_node(url: &str, pattern: &str) {
    // Synchronous: a drop cannot await, and this is a test's last step.
    let Ok(client) = redis::Client::open(url) else {
        return;
    };
    let Ok(mut connection) = client.get_connection_with_timeout(Duration::from_secs(2)) else {
        return;
    };
    let mut cursor = 0u64;
    loop {
        let Ok((next, keys)): redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query(&mut connection)
        else {
            return;
        };
        if !keys.is_empty() {
            let _: redis::RedisResult<u64> = redis::cmd("DEL").arg(&keys).query(&mut connection);
        }
        if next == 0 {
            return;
        }
        cursor = next;
    }
}
