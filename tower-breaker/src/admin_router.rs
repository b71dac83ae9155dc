//! The admin handle over HTTP: an axum router behind a bearer token.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Query, Request, State as Extract};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tower_classify::ConfigError;

use crate::admin::{BreakerHandle, BreakerSnapshot};

/// The shortest token [`BreakerHandle::router`] accepts.
const MIN_TOKEN_LEN: usize = 16;

impl BreakerHandle {
    /// An axum router serving this handle as JSON, behind `token` as
    /// [`require_token`] puts it.
    ///
    /// | method | path | body | does |
    /// |---|---|---|---|
    /// | `GET` | `/breakers` | | list every breaker |
    /// | `GET` | `/breakers/one?key=K` | | one breaker, `404` if unknown |
    /// | `POST` | `/breakers/reset` | `{"key": K}` | reset one |
    /// | `POST` | `/breakers/reset-all` | | reset every breaker |
    /// | `POST` | `/breakers/force-open` | `{"key": K}` | force open |
    /// | `POST` | `/breakers/force-closed` | `{"key": K}` | force closed |
    ///
    /// A body must be JSON with `Content-Type: application/json`; anything
    /// else is refused (`415`, or `400` for a body that does not parse or
    /// names no key) and changes nothing: a request that did not say which
    /// breaker it means never falls back to all of them. Resetting every
    /// breaker has its own path, so it is never what a malformed request
    /// does.
    ///
    /// Keys travel in the query or the body, not the path, because keys such
    /// as routes contain `/`. Mount it with `Router::nest` under a path of
    /// your choice, on a listener only operators reach.
    ///
    /// ```
    /// use tower_breaker::CircuitBreakerLayer;
    /// use tower_classify::HttpClassifier;
    ///
    /// let layer = CircuitBreakerLayer::new(HttpClassifier::new());
    /// let handle = layer.handle();
    /// let admin: axum::Router = handle.router("a-long-random-operator-token")?;
    /// # drop((layer, admin));
    /// # Ok::<(), tower_classify::ConfigError>(())
    /// ```
    pub fn router(&self, token: impl Into<String>) -> Result<Router, ConfigError> {
        let routes = Router::new()
            .route("/breakers", get(list))
            .route("/breakers/one", get(one))
            .route(
                "/breakers/reset",
                keyed(BreakerHandle::reset, |key| json!({"reset": [key]})),
            )
            .route("/breakers/reset-all", post(reset_all))
            .route(
                "/breakers/force-open",
                keyed(BreakerHandle::force_open, |key| json!({"forced_open": key})),
            )
            .route(
                "/breakers/force-closed",
                keyed(
                    BreakerHandle::force_closed,
                    |key| json!({"forced_closed": key}),
                ),
            )
            .fallback(|| async { StatusCode::NOT_FOUND })
            .with_state(self.clone());
        require_token(routes, token)
    }
}

/// Puts `router` behind the bearer token that [`BreakerHandle::router`]
/// requires, for other operator routes to share one check: every request, to
/// every path (the fallback too, so an unauthenticated caller cannot probe
/// which paths exist), must carry `Authorization: Bearer <token>`, compared
/// in constant time; anything else is answered `401`. Tokens shorter than 16
/// bytes are refused.
///
/// ```
/// use axum::routing::get;
///
/// let routes = axum::Router::new().route("/status", get(|| async { "ok" }));
/// let guarded = tower_breaker::require_token(routes, "a-long-random-operator-token")?;
/// # drop(guarded);
/// # Ok::<(), tower_classify::ConfigError>(())
/// ```
pub fn require_token(router: Router, token: impl Into<String>) -> Result<Router, ConfigError> {
    let token = token.into();
    if token.len() < MIN_TOKEN_LEN {
        return Err(ConfigError::new(
            "admin.token",
            format!("must be at least {MIN_TOKEN_LEN} bytes"),
        ));
    }
    let token: Arc<[u8]> = Arc::from(token.into_bytes());
    // `layer`, not `route_layer`: the fallback is guarded too.
    Ok(router.layer(middleware::from_fn_with_state(token, authorize)))
}

async fn authorize(Extract(token): Extract<Arc<[u8]>>, request: Request, next: Next) -> Response {
    if bearer(request.headers()).is_some_and(|given| constant_time_eq(given, &token)) {
        next.run(request).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            Json(json!({"code": "UNAUTHORIZED"})),
        )
            .into_response()
    }
}

fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"bearer ").then_some(token)
}

/// Compares without an early exit, so the time taken does not reveal how
/// much of a guess was right. The length is not secret: it is checked first.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The one JSON form of a snapshot, served by [`BreakerHandle::router`] and
/// by the facade's admin page: durations in whole milliseconds, the state by
/// its [`as_str`](crate::State::as_str) name and whether an operator forced it.
impl serde::Serialize for BreakerSnapshot {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let millis = |d: Duration| d.as_millis().min(u128::from(u64::MAX)) as u64;
        json!({
            "key": self.key,
            "state": self.state.as_str(),
            "forced": self.state.is_forced(),
            "time_in_state_ms": millis(self.time_in_state),
            "remaining_open_ms": self.remaining_open.map(millis),
            "consecutive_failures": self.consecutive_failures,
            "window_calls": self.window_calls,
            "window_failures": self.window_failures,
            "failures": self.failures,
            "rejected": self.rejected,
            "opened": self.opened,
            "probes_in_flight": self.probes_in_flight,
        })
        .serialize(serializer)
    }
}

async fn list(Extract(handle): Extract<BreakerHandle>) -> Json<Value> {
    Json(json!({ "breakers": handle.list() }))
}

#[derive(Deserialize)]
struct KeyQuery {
    key: String,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct KeyBody {
    key: Option<String>,
}

fn not_found(key: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"code": "UNKNOWN_BREAKER", "key": key})),
    )
        .into_response()
}

/// A request body naming a breaker, as axum extracts it.
type KeyRequest = Result<Json<KeyBody>, JsonRejection>;

/// A `POST` route applying `apply` to the breaker its body names and
/// answering `answer` of its key; `404` when there is none, and the request
/// refused when it names none.
fn keyed(
    apply: fn(&BreakerHandle, &str) -> bool,
    answer: fn(String) -> Value,
) -> MethodRouter<BreakerHandle> {
    let handler = move |Extract(handle): Extract<BreakerHandle>, body: KeyRequest| async move {
        let key = match body {
            Ok(Json(KeyBody { key: Some(key) })) => key,
            Ok(Json(KeyBody { key: None })) => {
                let why = json!({"code": "KEY_REQUIRED", "message": "the body must name a `key`"});
                return (StatusCode::BAD_REQUEST, Json(why)).into_response();
            }
            // A missing or wrong content type is 415, a body that does not parse
            // 400 or 422: axum's own status, with its reason.
            Err(rejection) => {
                let why = json!({"code": "BAD_BODY", "message": rejection.body_text()});
                return (rejection.status(), Json(why)).into_response();
            }
        };
        if apply(&handle, &key) {
            Json(answer(key)).into_response()
        } else {
            not_found(&key)
        }
    };
    post(handler)
}

async fn one(Extract(handle): Extract<BreakerHandle>, Query(query): Query<KeyQuery>) -> Response {
    match handle.get(&query.key) {
        Some(snapshot) => Json(snapshot).into_response(),
        None => not_found(&query.key),
    }
}

async fn reset_all(Extract(handle): Extract<BreakerHandle>) -> Response {
    Json(json!({"reset_all": handle.reset_all()})).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_whole_tokens() {
        assert!(constant_time_eq(b"abcdef", b"abcdef"));
        assert!(!constant_time_eq(b"abcdef", b"abcdeg"));
        assert!(!constant_time_eq(b"abcdef", b"abcde"));
        assert!(!constant_time_eq(b"", b"x"));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, "bEaReR tok".parse().unwrap());
        assert_eq!(bearer(&headers), Some(&b"tok"[..]));
        headers.insert(header::AUTHORIZATION, "Basic tok".parse().unwrap());
        assert_eq!(bearer(&headers), None);
    }
}
