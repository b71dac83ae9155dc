use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Method, Request, Response, Uri};
use http_body::Body;
use sha2::{Digest, Sha256};
use tower_classify::http::{Idempotency, IDEMPOTENCY_KEY};
use tower_classify::{BoxError, Classify, FailureKind, Outcome};
use tower_service::Service;

use super::rejection::Rejection;
use super::store::{Claim, ClaimToken, IdempotencyStore, StoredResponse};
use crate::capture::{read_prefix, CapturedBody};
use crate::future::ResponseFuture;

/// The header a replayed response carries.
pub const IDEMPOTENT_REPLAYED: http::HeaderName =
    http::HeaderName::from_static("idempotent-replayed");

/// The longest `Idempotency-Key` accepted, in characters.
pub const MAX_KEY_LEN: usize = 255;

/// A function reading a client identity from a request.
type Identity = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Reads the client identity that scopes keys.
#[derive(Clone)]
pub(crate) struct ScopeFn(pub(crate) Arc<Identity>);

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) ttl: Duration,
    pub(crate) in_flight_ttl: Duration,
    pub(crate) response_body_limit: usize,
    pub(crate) fingerprint_body_limit: usize,
    pub(crate) all_methods: bool,
    pub(crate) scope: Option<ScopeFn>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ttl: Duration::from_secs(24 * 3600),
            in_flight_ttl: Duration::from_secs(300),
            response_body_limit: 1024 * 1024,
            fingerprint_body_limit: 1024 * 1024,
            all_methods: false,
            scope: None,
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("ttl", &self.ttl)
            .field("in_flight_ttl", &self.in_flight_ttl)
            .field("response_body_limit", &self.response_body_limit)
            .field("fingerprint_body_limit", &self.fingerprint_body_limit)
            .field("all_methods", &self.all_methods)
            .field("scoped", &self.scope.is_some())
            .finish()
    }
}

/// Replays the stored response for a repeated `Idempotency-Key`.
///
/// Made by [`IdempotencyGuardLayer`](super::IdempotencyGuardLayer); see the
/// [module docs](super) for the rules.
///
/// It takes `Request<B>` and hands the inner service `Request<CapturedBody<B>>`
/// (the body with the bytes read for the fingerprint put back in front); it
/// returns `Response<CapturedBody<ResB>>` (the inner response's body, a stored
/// body, or the guard's own JSON answer).
///
/// # Clones
///
/// The guard awaits its store before calling the inner service, so the
/// service driven to readiness moves into the response future and a clone
/// takes its place; the inner service must be `Clone` (as axum routers,
/// hyper services and tower's `Buffer` are). Clones share the store.
pub struct IdempotencyGuard<S, St, C> {
    inner: S,
    shared: Arc<Shared<St, C>>,
}

struct Shared<St, C> {
    store: St,
    classifier: C,
    config: Config,
}

impl<S, St, C> IdempotencyGuard<S, St, C> {
    pub(crate) fn new(inner: S, store: St, classifier: C, config: Config) -> Self {
        IdempotencyGuard {
            inner,
            shared: Arc::new(Shared {
                store,
                classifier,
                config,
            }),
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The store keys are kept in.
    pub fn store(&self) -> &St {
        &self.shared.store
    }
}

impl<S: Clone, St, C> Clone for IdempotencyGuard<S, St, C> {
    fn clone(&self) -> Self {
        IdempotencyGuard {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, St: fmt::Debug, C: fmt::Debug> fmt::Debug for IdempotencyGuard<S, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyGuard")
            .field("inner", &self.inner)
            .field("store", &self.shared.store)
            .field("classifier", &self.shared.classifier)
            .field("config", &self.shared.config)
            .finish()
    }
}

impl<S, St, C, B, ResB> Service<Request<B>> for IdempotencyGuard<S, St, C>
where
    S: Service<Request<CapturedBody<B>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
    St: IdempotencyStore,
    C: Classify<Response<ResB>, S::Error> + Send + Sync + 'static,
{
    type Response = Response<CapturedBody<ResB>>;
    type Error = BoxError;
    type Future = ResponseFuture<Self::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        ResponseFuture::new(async move {
            let (parts, body) = request.into_parts();
            let config = &shared.config;
            let guarded = config.all_methods || !Idempotency::method_is_idempotent(&parts.method);
            let header = parts.headers.get(IDEMPOTENCY_KEY).filter(|_| guarded);
            let Some(header) = header else {
                let request = Request::from_parts(parts, CapturedBody::streaming(body));
                let response = inner.call(request).await.map_err(Into::into)?;
                return Ok(response.map(CapturedBody::streaming));
            };
            let key = match parse_key(header) {
                Ok(key) => key,
                Err(rejection) => return Ok(reject(rejection)),
            };
            let key = match &config.scope {
                Some(ScopeFn(identity)) => scoped(identity(&parts).as_deref(), key),
                None => key.to_owned(),
            };
            let (body, prefix, truncated) =
                read_prefix(body, config.fingerprint_body_limit).await?;
            let fingerprint = fingerprint(&parts.method, &parts.uri, &prefix, truncated);

            let claim = match shared
                .store
                .claim(&key, &fingerprint, config.in_flight_ttl)
                .await
            {
                Ok(claim) => claim,
                Err(error) => {
                    let chain = crate::entry::error_chain(&error).join(": ");
                    tracing::error!(
                        key,
                        error = chain,
                        "idempotency store failed to claim a key"
                    );
                    return Ok(reject(Rejection::StoreUnavailable));
                }
            };
            let claim = match claim {
                Claim::Acquired(claim) => claim,
                Claim::InFlight { fingerprint: other } if other != fingerprint => {
                    return Ok(reject(Rejection::Mismatch))
                }
                Claim::Completed {
                    fingerprint: other, ..
                } if other != fingerprint => return Ok(reject(Rejection::Mismatch)),
                Claim::InFlight { .. } => return Ok(reject(Rejection::InFlight)),
                Claim::Completed { response, .. } => {
                    count("replayed");
                    let mut replay = response.to_response(CapturedBody::full);
                    replay
                        .headers_mut()
                        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
                    return Ok(replay);
                }
            };
            count("claimed");
            let held = Held::new(shared.store.clone(), key, claim);

            let request = Request::from_parts(parts, body);
            // If this future is dropped from here on (a cancelled call),
            // dropping `held` releases the key.
            let response = match inner.call(request).await {
                Ok(response) => response,
                Err(error) => {
                    // No response, nothing to replay: let the retry run.
                    held.release("released").await;
                    return Err(error.into());
                }
            };
            if let Outcome::Failure(failure) =
                Classify::<_, S::Error>::classify(&shared.classifier, Ok(&response))
            {
                if failure.kind.is_transient() || failure.kind == FailureKind::Shed {
                    held.release("released").await;
                    return Ok(response.map(CapturedBody::streaming));
                }
            }
            let (parts, body) = response.into_parts();
            let (body, prefix, truncated) =
                match read_prefix(body, config.response_body_limit).await {
                    Ok(read) => read,
                    Err(error) => {
                        held.release("released").await;
                        return Err(error);
                    }
                };
            if truncated {
                tracing::warn!(
                    key = held.key(),
                    limit = config.response_body_limit,
                    "response too large to store for replay; idempotency key released"
                );
                held.release("too_large").await;
            } else {
                let stored = StoredResponse::new(parts.status, &parts.headers, prefix);
                held.complete(stored, config.ttl).await;
            }
            Ok(Response::from_parts(parts, body))
        })
    }
}

fn reject<B>(rejection: Rejection) -> Response<CapturedBody<B>> {
    count(rejection.code());
    rejection.response(CapturedBody::full)
}

fn count(outcome: &'static str) {
    metrics::counter!("tower_poison_idempotency_total", "outcome" => outcome).increment(1);
}

/// The key of a header value: visible ASCII, 1 to 255 characters, optionally
/// a quoted structured-field string (`"abc"`, as the IETF draft writes it).
fn parse_key(value: &HeaderValue) -> Result<&str, Rejection> {
    let text = value.to_str().map_err(|_| Rejection::KeyInvalid)?;
    let text = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    if text.len() > MAX_KEY_LEN {
        return Err(Rejection::KeyTooLong);
    }
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Rejection::KeyInvalid);
    }
    Ok(text)
}

/// A key in a client's own space. The identity's length goes first so no
/// identity/key pair can spell another's (`a:b` + `c` vs `a` + `b:c`).
fn scoped(identity: Option<&str>, key: &str) -> String {
    match identity {
        Some(identity) => format!("{}:{identity}:{key}", identity.len()),
        None => key.to_owned(),
    }
}

/// What makes two requests "the same": method, path and query, and the
/// SHA-256 of the body (of its first bytes when it was longer than the
/// fingerprint limit, marked `+`). Stable across processes and versions, so
/// nodes sharing a store agree.
fn fingerprint(method: &Method, uri: &Uri, body: &[u8], truncated: bool) -> String {
    let digest = Sha256::digest(body);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let more = if truncated { "+" } else { "" };
    format!("{method} {path} sha256:{hex}{more}")
}

/// A key this call holds. Dropped without [`complete`](Self::complete) or
/// [`release`](Self::release) (the call was cancelled or failed), it
/// releases the key in a spawned task.
struct Held<St: IdempotencyStore> {
    held: Option<(St, String, ClaimToken)>,
}

impl<St: IdempotencyStore> Held<St> {
    fn new(store: St, key: String, claim: ClaimToken) -> Self {
        Held {
            held: Some((store, key, claim)),
        }
    }

    fn key(&self) -> &str {
        self.held.as_ref().map_or("", |(_, key, _)| key)
    }

    async fn release(mut self, why: &'static str) {
        if let Some((store, key, claim)) = self.held.take() {
            release(store, key, claim, why).await;
        }
    }

    async fn complete(mut self, response: StoredResponse, ttl: Duration) {
        let Some((store, key, claim)) = self.held.take() else {
            return;
        };
        match store.complete(&key, &claim, response, ttl).await {
            Ok(true) => count("stored"),
            Ok(false) => {
                // The claim lapsed (in-flight TTL) or was evicted: another
                // request may own the key now, so leave it alone.
                count("lapsed");
                tracing::warn!(
                    key,
                    "idempotency claim lapsed before the response was stored"
                );
            }
            Err(error) => {
                // Keep the claim rather than release it: the request *was*
                // applied, and running it again on a repeat would duplicate
                // it. Repeats get 409 until the in-flight TTL.
                count("store_failed");
                let chain = crate::entry::error_chain(&error).join(": ");
                tracing::error!(
                    key,
                    error = chain,
                    "idempotency store failed to keep a response"
                );
            }
        }
    }
}

async fn release<St: IdempotencyStore>(
    store: St,
    key: String,
    claim: ClaimToken,
    why: &'static str,
) {
    match store.release(&key, &claim).await {
        Ok(_) => count(why),
        Err(error) => {
            let chain = crate::entry::error_chain(&error).join(": ");
            tracing::error!(
                key,
                error = chain,
                "idempotency store failed to release a key; it lapses after the in-flight TTL"
            );
        }
    }
}

impl<St: IdempotencyStore> Drop for Held<St> {
    fn drop(&mut self) {
        let Some((store, key, claim)) = self.held.take() else {
            return;
        };
        // Outside a runtime (the runtime is shutting down) the key lapses
        // after the in-flight TTL instead.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(release(store, key, claim, "cancelled"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_visible_ascii_up_to_255_characters() {
        let ok = HeaderValue::from_static("order-42");
        assert_eq!(parse_key(&ok), Ok("order-42"));
        let quoted = HeaderValue::from_static("\"8e03978e-40d5-43e8-bc93-6894a57f9324\"");
        assert_eq!(
            parse_key(&quoted),
            Ok("8e03978e-40d5-43e8-bc93-6894a57f9324")
        );
        let max = HeaderValue::from_str(&"k".repeat(255)).unwrap();
        assert!(parse_key(&max).is_ok());
        let long = HeaderValue::from_str(&"k".repeat(256)).unwrap();
        assert_eq!(parse_key(&long), Err(Rejection::KeyTooLong));
        for bad in ["", "\"\"", "with space"] {
            let value = HeaderValue::from_str(bad).unwrap();
            assert_eq!(parse_key(&value), Err(Rejection::KeyInvalid), "{bad:?}");
        }
        let binary = HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap();
        assert_eq!(parse_key(&binary), Err(Rejection::KeyInvalid));
    }

    proptest::proptest! {
        /// Any visible-ASCII key of 1 to 255 characters is taken as it is;
        /// any longer one is refused as too long.
        #[test]
        fn keys_are_accepted_exactly_up_to_the_limit(key in "[!-~]{1,400}") {
            let value = HeaderValue::from_str(&key).unwrap();
            let quoted = key.len() >= 2 && key.starts_with('"') && key.ends_with('"');
            let inner = if quoted { &key[1..key.len() - 1] } else { &key[..] };
            match parse_key(&value) {
                Ok(parsed) => {
                    proptest::prop_assert_eq!(parsed, inner);
                    proptest::prop_assert!(parsed.len() <= MAX_KEY_LEN);
                }
                Err(Rejection::KeyTooLong) => proptest::prop_assert!(inner.len() > MAX_KEY_LEN),
                Err(other) => {
                    proptest::prop_assert!(inner.is_empty(), "{other:?} for {key:?}");
                }
            }
        }
    }

    #[test]
    fn scoped_keys_cannot_collide_across_identities() {
        assert_ne!(scoped(Some("a:b"), "c"), scoped(Some("a"), "b:c"));
        assert_eq!(scoped(None, "k"), "k");
    }

    #[test]
    fn fingerprints_differ_by_method_path_query_and_body() {
        let uri: Uri = "http://x/orders?a=1".parse().unwrap();
        let base = fingerprint(&Method::POST, &uri, b"{}", false);
        assert_eq!(base, fingerprint(&Method::POST, &uri, b"{}", false));
        assert_ne!(base, fingerprint(&Method::PATCH, &uri, b"{}", false));
        assert_ne!(
            base,
            fingerprint(&Method::POST, &"/orders?a=2".parse().unwrap(), b"{}", false)
        );
        assert_ne!(base, fingerprint(&Method::POST, &uri, b"{ }", false));
        assert_ne!(base, fingerprint(&Method::POST, &uri, b"{}", true));
        // The host is not part of it: two nodes behind one name agree.
        let other_host: Uri = "http://y/orders?a=1".parse().unwrap();
        assert_eq!(base, fingerprint(&Method::POST, &other_host, b"{}", false));
    }
}
