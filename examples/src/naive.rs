//! The baseline the demo compares against: naive retry.
//!
//! A fixed number of retries after a fixed pause, no jitter, no budget, no
//! breaker, every failure retried: the configuration that turns an outage into
//! a retry storm.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tower::retry::{Policy, RetryLayer};

use crate::client::{HttpRequest, HttpResponse, HttpService};
use tower::BoxError;

/// `retries` retries after `pause` each, for any failure.
#[derive(Debug, Clone)]
pub struct NaiveRetry {
    retries: usize,
    pause: Duration,
}

impl NaiveRetry {
    /// The policy.
    pub fn new(retries: usize, pause: Duration) -> Self {
        NaiveRetry { retries, pause }
    }
}

impl Policy<HttpRequest, HttpResponse, BoxError> for NaiveRetry {
    type Future = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn retry(
        &mut self,
        _request: &mut HttpRequest,
        result: &mut Result<HttpResponse, BoxError>,
    ) -> Option<Self::Future> {
        let failed = match result {
            Ok(response) => !response.status().is_success(),
            Err(_) => true,
        };
        if !failed || self.retries == 0 {
            return None;
        }
        self.retries -= 1;
        Some(Box::pin(tokio::time::sleep(self.pause)))
    }

    fn clone_request(&mut self, request: &HttpRequest) -> Option<HttpRequest> {
        Some(request.clone())
    }
}

/// `client` wrapped in naive retry.
pub fn naive_stack(client: HttpService, retries: usize, pause: Duration) -> HttpService {
    HttpService::new(
        tower::ServiceBuilder::new()
            .layer(RetryLayer::new(NaiveRetry::new(retries, pause)))
            .service(client),
    )
}
