//! The gateway of the `prometheus` example and of its scrape test: an axum
//! app calling two downstreams, each through the whole stack under its own
//! name, with the `metrics` series exposed at `/metrics` by
//! metrics-exporter-prometheus.
//!
//! ```text
//! GET /inventory ─→ DeadLetter → CircuitBreaker → Retry ("inventory") ─→ inventory
//! GET /payments  ─→ DeadLetter → CircuitBreaker → Retry ("payments")  ─→ payments
//! GET /metrics   ─→ the Prometheus text format
//! ```

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing;
use axum::Router;
use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::Full;
use metrics_exporter_prometheus::PrometheusHandle;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_poison::store::MemoryStore;
use tower_poison::{OpenCall, ReplayBody, SettleBody};
use tower_steadfast::ResilienceConfig;

use crate::client::{http_client_for, HttpRequest, HttpResponse};

/// The configuration both downstreams share; the names keep them apart.
pub const CONFIG: &str = r#"
resilience:
  retry:
    max_attempts: 3
    backoff: fixed
    base_ms: 10
    jitter: false
    retry_on: [http_5xx, connection]
  circuit_breaker:
    consecutive_failures: 3
    cooldown_secs: 60
  poison:
    action: dlq
"#;

type Client = BoxCloneSyncService<HttpRequest, HttpResponse, BoxError>;

#[derive(Clone)]
struct Downstream {
    uri: Uri,
    client: Client,
}

#[derive(Clone)]
struct Gateway {
    inventory: Downstream,
    payments: Downstream,
    metrics: PrometheusHandle,
}

/// A client to `uri` through the stack named `name`.
fn downstream(config: &ResilienceConfig, name: &str, uri: Uri) -> Downstream {
    let client = ServiceBuilder::new()
        // The stack's body is a `SettleBody`; HTTP calls are settled by
        // their head, so the buffered body is taken out as it was.
        .map_response(|response: Response<SettleBody<Bytes, OpenCall>>| {
            response.map(SettleBody::into_inner)
        })
        .layer(config.layer(name, MemoryStore::new(1_000)))
        .service(http_client_for::<ReplayBody<Full<Bytes>>>());
    Downstream {
        uri,
        client: BoxCloneSyncService::new(client),
    }
}

async fn call(downstream: &Downstream) -> (StatusCode, String) {
    let request = Request::get(downstream.uri.clone())
        .body(Full::new(Bytes::new()))
        .expect("a valid request");
    match downstream.client.clone().oneshot(request).await {
        Ok(response) => (
            response.status(),
            String::from_utf8_lossy(response.body()).into_owned(),
        ),
        Err(error) => (StatusCode::BAD_GATEWAY, error.to_string()),
    }
}

/// The gateway's routes. `metrics` renders what the installed
/// `PrometheusRecorder` holds.
pub fn router(metrics: PrometheusHandle, inventory: Uri, payments: Uri) -> Router {
    let config = ResilienceConfig::from_yaml_str(CONFIG).expect("the example's configuration");
    let gateway = Gateway {
        inventory: downstream(&config, "inventory", inventory),
        payments: downstream(&config, "payments", payments),
        metrics,
    };
    Router::new()
        .route(
            "/inventory",
            routing::get(
                |State(gateway): State<Gateway>| async move { call(&gateway.inventory).await },
            ),
        )
        .route(
            "/payments",
            routing::get(
                |State(gateway): State<Gateway>| async move { call(&gateway.payments).await },
            ),
        )
        .route(
            "/metrics",
            routing::get(|State(gateway): State<Gateway>| async move { gateway.metrics.render() }),
        )
        .with_state(gateway)
}

/// Serves `router` on 127.0.0.1 on a free port, in the background.
pub async fn serve(router: Router) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        axum::serve(listener, router).await.ok();
    });
    Ok(addr)
}

/// A GET of `url` with a plain hyper-util client: the status and the body
/// as text.
pub async fn get(url: &str) -> Result<(StatusCode, String), BoxError> {
    let request = Request::get(url).body(Full::new(Bytes::new()))?;
    let response = crate::client::http_client().oneshot(request).await?;
    Ok((
        response.status(),
        String::from_utf8_lossy(response.body()).into_owned(),
    ))
}

/// One sample of a Prometheus text-format scrape: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series' name.
    pub name: String,
    /// Its labels, in the order written.
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, if the sample has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The samples of a scrape, comments skipped. Enough of the text format for
/// the series this family writes (no escaped quotes in label values).
pub fn parse_scrape(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let value = value.parse().ok()?;
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|pair| !pair.is_empty())
                .filter_map(|pair| {
                    let (key, value) = pair.split_once('=')?;
                    Some((key.to_owned(), value.trim_matches('"').to_owned()))
                })
                .collect();
            Some(Sample {
                name: name.to_owned(),
                labels,
                value,
            })
        })
        .collect()
}
