//! [`AdminPage`], the operator's page.

mod counts;
mod dead_letters;
mod guard;
mod routes;

use std::fmt;
use std::sync::Arc;

use axum::middleware;
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::Full;
use tower_breaker::BreakerHandle;
use tower_classify::{BoxError, ConfigError};
use tower_poison::store::DeadLetterStore;
use tower_service::Service;

pub(crate) use self::counts::RetryCounts;
use self::dead_letters::{DeadLetters, StoreAndTarget};
use self::routes::Shared;
use crate::ResilienceLayer;

/// `POST` of a breaker action, answering `{done: key}`.
fn breaker(
    action: fn(&BreakerHandle, &str) -> bool,
    done: &'static str,
) -> MethodRouter<Arc<Shared>> {
    post(move |page, request| routes::breaker_action(page, request, action, done))
}

/// The operator's page for one or more stacks and dead-letter stores,
/// live, with the actions an operator needs at 3 a.m.
///
/// `AdminPage` builds an axum [`Router`] to mount on a listener only
/// operators reach. It serves:
///
/// | method | path | does |
/// |---|---|---|
/// | `GET` | `/`, `/index.html` | the page (HTML, no data) |
/// | `GET` | `/admin.js`, `/admin.css` | its script and style |
/// | `GET` | `/api/state?label=L&limit=N` | breakers, dead letters, retry counts |
/// | `GET` | `/api/dead-letters/entry?store=S&id=ID` | one entry, as stored |
/// | `POST` | `/api/breakers/force-open` `{"key"}` | force a breaker open |
/// | `POST` | `/api/breakers/force-closed` `{"key"}` | force it closed |
/// | `POST` | `/api/breakers/reset` `{"key"}` | end a forced state, close it |
/// | `POST` | `/api/dead-letters/replay` `{"store", "id"}` | send an entry again |
/// | `POST` | `/api/dead-letters/purge` `{"store", "id"}` or `{"store", "label"}` | remove one entry, or a label's entries |
///
/// # Security
///
/// - Every `/api` request needs `Authorization: Bearer <token>`
///   ([`require_token`](tower_breaker::require_token)): `401` otherwise.
///   The page and its assets carry no data and need none; the page keeps
///   the token in the tab's `sessionStorage`, never in a URL.
/// - Writes are `POST`s with a JSON body, refused with `403` when the
///   browser says they come from another site (an `Origin` that is not the
///   `Host`, or with no `Host` header the URI's authority, as HTTP/2's
///   `:authority` arrives, or `Sec-Fetch-Site: cross-site`). Behind a reverse proxy, pass
///   the browser's `Host` on, or every write from the page is refused.
/// - The server puts no stored value into HTML; the script writes every
///   value as text, never markup, under a content security policy that
///   forbids inline script, other origins and framing.
/// - Every listing is bounded: at most 200 breakers and 50 entries a store
///   per poll; a summary reads at most 10,000 entries of a store (past that,
///   the per-label depths say they are partial); an entry shows at most
///   16 KiB of its body; a purge removes at most 10,000 entries.
///
/// # What the rates are
///
/// Differences of totals between two polls (every two seconds). A stack
/// built by [`ResilienceConfig::layer`] counts its retry layer's events for
/// the page (retries, give-ups, budget refusals, recoveries); one built with
/// [`ResilienceLayer::new`] shows its breaker only.
///
/// [`ResilienceConfig::layer`]: crate::ResilienceConfig::layer
///
/// # Example
///
/// ```
/// use tower_poison::store::MemoryStore;
/// use tower_steadfast::{AdminPage, ResilienceConfig};
///
/// # async fn replay_client(_: http::Request<http_body_util::Full<bytes::Bytes>>)
/// #     -> Result<http::Response<()>, std::io::Error> { Ok(http::Response::new(())) }
/// let store = MemoryStore::new(10_000);
/// let orders = ResilienceConfig::default().layer("orders", store.clone());
/// let admin: axum::Router = AdminPage::new("a-long-random-operator-token")
///     .stack(&orders)
///     // Replays go to the orders service, through any HTTP client service.
///     .dead_letters(store, "http://orders.internal:8080".parse()?, tower::service_fn(replay_client))
///     .router()?;
/// // axum::Router::new().nest("/admin", admin) on the operators' listener.
/// # drop(admin);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AdminPage {
    token: String,
    shared: Shared,
}

impl fmt::Debug for AdminPage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the token.
        f.debug_struct("AdminPage")
            .field("breakers", &self.shared.breakers)
            .field("stacks", &self.shared.retries.len())
            .field("stores", &self.shared.dead_letters.len())
            .finish_non_exhaustive()
    }
}

impl AdminPage {
    /// A page behind `token` (at least 16 bytes; [`router`](Self::router)
    /// refuses a shorter one), showing nothing yet.
    pub fn new(token: impl Into<String>) -> Self {
        AdminPage {
            token: token.into(),
            shared: Shared::default(),
        }
    }

    /// Shows `stack`'s breaker and retry counts. Its store is shown by
    /// [`dead_letters`](Self::dead_letters), once however many stacks share
    /// it.
    pub fn stack<St>(mut self, stack: &ResilienceLayer<St>) -> Self {
        self.shared.breakers.push(stack.breaker_handle());
        self.shared
            .retries
            .push((stack.retry.name().to_owned(), stack.retry_counts.clone()));
        self
    }

    /// Shows `store`'s entries, and replays them to `destination` through
    /// `client` (an HTTP client service): each entry is rebuilt with
    /// [`http_request`](tower_poison::replay::http_request) and sent by a
    /// [`Replayer`](tower_poison::replay::Replayer), which removes it on
    /// success and records the failure otherwise.
    pub fn dead_letters<St, S, B>(mut self, store: St, destination: Uri, client: S) -> Self
    where
        St: DeadLetterStore,
        S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone + Send + Sync + 'static,
        S::Future: Send,
        S::Error: Into<BoxError> + Send,
        B: Send + 'static,
    {
        let store: Box<dyn DeadLetters> = Box::new(StoreAndTarget {
            store,
            service: client,
            destination,
        });
        self.shared.dead_letters.push(store);
        self
    }

    /// The router. Fails when the token is shorter than 16 bytes.
    pub fn router(self) -> Result<Router, ConfigError> {
        let shared = Arc::new(self.shared);
        let api = Router::new()
            .route("/state", get(routes::state))
            .route("/dead-letters/entry", get(routes::entry))
            .route(
                "/breakers/force-open",
                breaker(BreakerHandle::force_open, "forced_open"),
            )
            .route(
                "/breakers/force-closed",
                breaker(BreakerHandle::force_closed, "forced_closed"),
            )
            .route("/breakers/reset", breaker(BreakerHandle::reset, "reset"))
            .route("/dead-letters/replay", post(routes::replay))
            .route("/dead-letters/purge", post(routes::purge))
            .fallback(|| async { http::StatusCode::NOT_FOUND })
            .with_state(shared)
            .layer(middleware::from_fn(guard::same_origin));
        // The token is checked first, so an unauthenticated caller learns
        // nothing else; the headers go on every answer, refusals included.
        let api = tower_breaker::require_token(api, self.token)?
            .layer(middleware::map_response(routes::api_headers));
        Ok(Router::new()
            .route("/", get(routes::page))
            .route("/admin.js", get(routes::script))
            .route("/admin.css", get(routes::style))
            .route("/index.html", get(routes::page))
            .nest("/api", api))
    }
}
