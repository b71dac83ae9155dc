//! How the Redis stores connect.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Client;

use crate::{redact_url, StoreError};

/// How a Redis store connects: one reconnecting [`ConnectionManager`] per
/// store, shared by its clones.
///
/// The defaults fail a command quickly while Redis is unreachable (a 1 s
/// connection timeout, one reconnection attempt, a 5 s response timeout), so
/// a call made during an outage gets a clear error instead of hanging; the
/// manager reconnects in the background (waiting 50 ms to 500 ms between
/// attempts) and later calls succeed again.
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
    /// short exponential backoff between them.
    pub const fn reconnect_retries(mut self, retries: usize) -> Self {
        self.reconnect_retries = retries;
        self
    }

    /// Connects to `url` (`redis://host:port/db`), failing if Redis does not
    /// answer now. The error names the URL without its password
    /// ([`redact_url`]).
    pub async fn connect(&self, url: &str) -> Result<ConnectionManager, StoreError> {
        let shown = redact_url(url);
        let client = Client::open(url)
            .map_err(|e| StoreError::backend(format!("invalid redis url {shown:?}"), e))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connection_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(self.reconnect_retries)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| StoreError::backend(format!("cannot connect to redis at {shown}"), e))
    }
}
