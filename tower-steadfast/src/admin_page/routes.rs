//! The page's routes: the static page, the JSON it polls, and the actions.

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::rejection::JsonRejection;
use axum::extract::{OriginalUri, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use tower_breaker::BreakerHandle;
use tower_poison::store::StoreError;
use tower_poison::EntryId;

use super::counts::RetryCounts;
use super::dead_letters::{millis, DeadLetters, MAX_NEWEST, SCAN_LIMIT};

/// The most breakers one poll lists (a keyed breaker may hold thousands).
pub(crate) const MAX_BREAKERS: usize = 200;
/// Entries listed per store when the page does not ask for a number.
const DEFAULT_NEWEST: usize = 20;

const PAGE_HTML: &str = include_str!("page.html");
const PAGE_JS: &str = include_str!("page.js");
const PAGE_CSS: &str = include_str!("page.css");

/// What the routes read and act on.
#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) breakers: Vec<BreakerHandle>,
    pub(crate) retries: Vec<(String, Option<Arc<RetryCounts>>)>,
    pub(crate) dead_letters: Vec<Box<dyn DeadLetters>>,
}

pub(crate) type Page = State<Arc<Shared>>;

// The page and its assets hold no data: everything shown is fetched with
// the token and put in the page as text. The policy forbids inline script,
// other origins, framing and form posts, so even a value that slipped
// through escaping could not run.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
    ];
    (headers, body).into_response()
}

/// The page, at `/` and `/index.html`. Its script and style are named
/// relative to it, so the page reached at an address without a trailing
/// slash (`/admin` under `nest("/admin", …)`, which does not route
/// `/admin/`) is sent on to `admin/index.html` next to it. The redirect is
/// relative and names one path segment, so it cannot point at another
/// site.
pub(crate) async fn page(OriginalUri(original): OriginalUri) -> Response {
    let path = original.path();
    if !path.ends_with('/') && !path.ends_with("/index.html") {
        let last = path.rsplit('/').next().unwrap_or_default();
        return Redirect::to(&format!("./{last}/index.html")).into_response();
    }
    asset("text/html; charset=utf-8", PAGE_HTML)
}

pub(crate) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", PAGE_JS)
}

pub(crate) async fn style() -> Response {
    asset("text/css; charset=utf-8", PAGE_CSS)
}

/// Every API answer (refusals too): never cached, never sniffed as HTML.
pub(crate) async fn api_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// A request refused: its status and a JSON `{code, message}`.
pub(crate) struct Refused(StatusCode, &'static str, String);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let Refused(status, code, message) = self;
        (status, Json(json!({"code": code, "message": message}))).into_response()
    }
}

pub(crate) fn error(status: StatusCode, code: &'static str, message: impl Into<String>) -> Refused {
    Refused(status, code, message.into())
}

#[derive(Deserialize)]
pub(crate) struct StateQuery {
    label: Option<String>,
    limit: Option<usize>,
}

/// Everything the page shows, in one poll.
pub(crate) async fn state(State(shared): Page, Query(query): Query<StateQuery>) -> Response {
    let mut breakers = Vec::new();
    let mut total = 0;
    for handle in &shared.breakers {
        let list = handle.list();
        total += list.len();
        breakers.extend(list.into_iter().take(MAX_BREAKERS - breakers.len()));
    }
    let newest = query.limit.unwrap_or(DEFAULT_NEWEST).min(MAX_NEWEST);
    let mut stores = Vec::new();
    for (index, store) in shared.dead_letters.iter().enumerate() {
        stores.push(match store.summary(query.label.clone(), newest).await {
            Ok(mut summary) => {
                summary["store"] = json!(index);
                summary
            }
            Err(e) => json!({"store": index, "error": e.to_string()}),
        });
    }
    let retries: Vec<Value> = shared
        .retries
        .iter()
        .map(|(name, counts)| match counts {
            Some(counts) => counts.to_json(name),
            None => json!({"name": name, "counted": false}),
        })
        .collect();
    Json(json!({
            "now_ms": millis(SystemTime::now()),
            "breakers": breakers,
            "breakers_total": total,
            "dead_letters": stores,
            "retries": retries,
            "limits": {"breakers": MAX_BREAKERS, "newest": newest, "scan": SCAN_LIMIT},
    }))
    .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct KeyBody {
    key: String,
}

/// A request's JSON body, or why it could not be read.
pub(crate) type JsonBody<T> = Result<Json<T>, JsonRejection>;

impl From<JsonRejection> for Refused {
    fn from(rejection: JsonRejection) -> Self {
        error(rejection.status(), "BAD_BODY", rejection.body_text())
    }
}

/// A breaker action: the first handle that knows the key applies it.
pub(crate) async fn breaker_action(
    State(shared): Page,
    request: JsonBody<KeyBody>,
    action: fn(&BreakerHandle, &str) -> bool,
    done: &str,
) -> Result<Response, Refused> {
    let Json(KeyBody { key }) = request?;
    if !shared.breakers.iter().any(|handle| action(handle, &key)) {
        let unknown = json!({"code": "UNKNOWN_BREAKER", "key": key});
        return Ok((StatusCode::NOT_FOUND, Json(unknown)).into_response());
    }
    Ok(Json(json!({ done: key })).into_response())
}

fn dead_letters(shared: &Shared, store: usize) -> Result<&dyn DeadLetters, Refused> {
    match shared.dead_letters.get(store) {
        Some(store) => Ok(&**store),
        None => Err(error(
            StatusCode::NOT_FOUND,
            "UNKNOWN_STORE",
            format!("no store {store}"),
        )),
    }
}

fn store_failed(e: StoreError) -> Refused {
    error(StatusCode::BAD_GATEWAY, "STORE", e.to_string())
}

fn entry_id(text: &str) -> Result<EntryId, Refused> {
    text.parse()
        .map_err(|_| error(StatusCode::BAD_REQUEST, "BAD_ID", "not an entry id"))
}

#[derive(Deserialize)]
pub(crate) struct EntryQuery {
    store: usize,
    id: String,
}

pub(crate) async fn entry(
    State(shared): Page,
    Query(query): Query<EntryQuery>,
) -> Result<impl IntoResponse, Refused> {
    let store = dead_letters(&shared, query.store)?;
    let found = store.show(entry_id(&query.id)?).await;
    match found.map_err(store_failed)? {
        Some(entry) => Ok(Json(entry)),
        None => Err(error(StatusCode::NOT_FOUND, "UNKNOWN_ENTRY", query.id)),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EntryBody {
    store: usize,
    id: String,
}

pub(crate) async fn replay(
    State(shared): Page,
    request: JsonBody<EntryBody>,
) -> Result<impl IntoResponse, Refused> {
    let Json(EntryBody { store, id }) = request?;
    let store = dead_letters(&shared, store)?;
    let replayed = store.replay(entry_id(&id)?).await;
    let outcome = replayed.map_err(|e| error(StatusCode::BAD_GATEWAY, "REPLAY", e.to_string()))?;
    Ok(Json(outcome))
}

/// Purges one entry (`id`) or every entry of a label (`label`), never both
/// and never the whole store: a body that names neither is refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PurgeBody {
    store: usize,
    id: Option<String>,
    label: Option<String>,
}

pub(crate) async fn purge(
    State(shared): Page,
    request: JsonBody<PurgeBody>,
) -> Result<impl IntoResponse, Refused> {
    let Json(PurgeBody { store, id, label }) = request?;
    let store = dead_letters(&shared, store)?;
    let purged = match (id, label) {
        (Some(id), None) => u64::from(store.remove(entry_id(&id)?).await.map_err(store_failed)?),
        (None, Some(label)) => store.purge_label(label).await.map_err(store_failed)?,
        _ => {
            let problem = "name either one entry `id` or one `label`";
            return Err(error(StatusCode::BAD_REQUEST, "ID_OR_LABEL", problem));
        }
    };
    Ok(Json(json!({ "purged": purged })))
}
