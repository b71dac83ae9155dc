//! How the Redis stores connect.

use std::fmt;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, Pipeline, RedisFuture, Value};

use crate::url::split_list;
use crate::{redact_url, StoreError};

/// How a Redis store connects: one reconnecting connection per store,
/// shared by its clones, to one Redis server or to a Redis Cluster.
///
/// # One server or a cluster
///
/// One URL (`redis://host:port/db`, `rediss://…`, `redis+unix://…`) is one
/// server, through the `redis` crate's [`ConnectionManager`]; a
/// comma-separated list of node URLs is a Redis Cluster, through its
/// cluster client ([`ClusterConnection`]). The crate's
/// [Redis Cluster](crate#redis-cluster) section has the rules for the list
/// and for the keys one call may touch.
///
/// # Timeouts
///
/// The defaults fail a command quickly while Redis is unreachable (a 1 s
/// connection timeout, one reconnection attempt, a 5 s response timeout), so
/// a call made during an outage gets a clear error instead of hanging; the
/// connection reconnects in the background (waiting 50 ms to 500 ms between
/// attempts) and later calls succeed again. On a cluster the same settings
/// apply to each node's connection, and the response timeout also bounds a
/// whole command with its redirections and retries.
///
/// One difference a cluster brings: where one server's connection answers a
/// dropped connection with an error, the cluster client sends the command
/// again on a new one, so a command that ran just before a node restarted
/// or failed over can run twice. A poison count may then be one delivery
/// ahead (a message diverted one delivery early), and an idempotency claim
/// or a dead-letter claim may meet its own first run and answer "in flight"
/// or "held" until its lease ends. Nothing is stored twice: the stores'
/// writes are keyed, so repeating them changes nothing.
#[derive(Debug, Clone)]
pub struct RedisConnectOptions {
    connection_timeout: Duration,
    response_timeout: Duration,
    reconnect_retries: usize,
}

impl Default for RedisConnectOptions {
    fn default() -> Self {
        Self::new()
    }
}

const MIN_RETRY_DELAY: Duration = Duration::from_millis(50);
const MAX_RETRY_DELAY: Duration = Duration::from_millis(500);

impl RedisConnectOptions {
    /// The defaults described above.
    pub const fn new() -> Self {
        RedisConnectOptions {
            connection_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(5),
            reconnect_retries: 1,
        }
    }

    /// Gives up on connecting after `timeout` (default 1 s).
    pub const fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Gives up on a command's reply after `timeout` (default 5 s).
    pub const fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Reconnection attempts after a connection is lost (default 1), with a
    /// short exponential backoff between them. On a cluster a call may also
    /// follow two redirections (a slot that moved, a key being migrated).
    pub const fn reconnect_retries(mut self, retries: usize) -> Self {
        self.reconnect_retries = retries;
        self
    }

    /// Connects to `url`, one server (`redis://host:port/db`) or a cluster
    /// (a comma-separated list of its nodes' URLs; see above), failing if
    /// Redis does not answer now. The error names the URL without its
    /// password ([`redact_url`]).
    pub async fn connect(&self, url: &str) -> Result<RedisConnection, StoreError> {
        let shown = redact_url(url);
        let invalid = |e| StoreError::backend(format!("invalid redis url {shown:?}"), e);
        let unreachable = |e| StoreError::backend(format!("cannot connect to redis at {shown}"), e);
        let pieces = split_list(url);
        let connection = if pieces.len() > 1 {
            let nodes = pieces
                .into_iter()
                .map(str::trim)
                .filter(|node| !node.is_empty());
            let client = ClusterClient::builder(nodes)
                .connection_timeout(self.connection_timeout)
                .response_timeout(self.response_timeout)
                .retries(cluster_retries(self.reconnect_retries))
                .min_retry_wait(millis(MIN_RETRY_DELAY))
                .max_retry_wait(millis(MAX_RETRY_DELAY))
                .build()
                .map_err(invalid)?;
            let connection = client.get_async_connection().await.map_err(unreachable)?;
            Connection::Cluster(connection)
        } else {
            let client = Client::open(url).map_err(invalid)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(self.connection_timeout))
                .set_response_timeout(Some(self.response_timeout))
                .set_number_of_retries(self.reconnect_retries)
                .set_min_delay(MIN_RETRY_DELAY)
                .set_max_delay(MAX_RETRY_DELAY);
            let manager = ConnectionManager::new_with_config(client, config)
                .await
                .map_err(unreachable)?;
            Connection::Single(manager)
        };
        Ok(RedisConnection(connection))
    }
}

/// The cluster client counts a redirection as a retry: two more than the
/// reconnection attempts let a call follow a moved slot (`MOVED`) and then a
/// key still migrating (`ASK`).
fn cluster_retries(reconnect_retries: usize) -> u32 {
    u32::try_from(reconnect_retries)
        .unwrap_or(u32::MAX)
        .saturating_add(2)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A store's connection to Redis, made by [`RedisConnectOptions::connect`]:
/// to one server or to a cluster, used alike through
/// [`ConnectionLike`] (`query_async`, `invoke_async`). Clones share the
/// connection.
#[derive(Clone)]
pub struct RedisConnection(Connection);

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.0 {
            Connection::Single(connection) => connection.req_packed_command(cmd),
            Connection::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.0 {
            Connection::Single(single) => single.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(cluster) => cluster.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Connection::Single(connection) => connection.get_db(),
            Connection::Cluster(connection) => connection.get_db(),
        }
    }
}

impl fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.0 {
            Connection::Single(_) => "single",
            Connection::Cluster(_) => "cluster",
        };
        f.debug_tuple("RedisConnection").field(&kind).finish()
    }
}
