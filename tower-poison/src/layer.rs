use std::fmt;
use std::sync::Arc;

use http::header::HeaderName;
use tower_classify::{FailureKind, HttpClassifier};
use tower_layer::Layer;

use crate::action::Action;
use crate::capture::HttpCapture;
use crate::counts::{DeliveryCount, FailureCountStore};
use crate::observability::ForgetfulMap;
use crate::poison::{PoisonCounting, PoisonPolicy};
use crate::redact::Redactor;
use crate::service::{DeadLetter, Settings, Shared, LOGGED_KEYS};

/// The label of a layer's entries unless [`label`](DeadLetterLayer::label) sets one.
pub(crate) const DEFAULT_LABEL: &str = "default";

/// The failure kinds [`DeadLetterLayer::for_server`] stores: what an operator
/// must act on. A server's `4xx` answers (a scanner's `404`, a client's
/// invalid request) and its own load shedding (an open circuit) are the
/// caller's business, and would fill the store during an attack or an
/// outage.
pub const SERVER_KINDS: [FailureKind; 6] = [
    FailureKind::ServerError,
    FailureKind::RateLimited,
    FailureKind::Timeout,
    FailureKind::Connection,
    FailureKind::NotSent,
    FailureKind::Poison,
];

/// Applies [`DeadLetter`] to a service: failed calls are written to a
/// [`DeadLetterStore`](crate::store::DeadLetterStore).
///
/// The defaults suit HTTP: [`HttpClassifier`] decides what a failure is,
/// [`HttpCapture`] records method, URI, headers and up to 64 KiB of body, the
/// action is [`Action::Dlq`], the label is `"default"`, and refusals that
/// never reached the dependency are passed through, not stored (see
/// [`store_refusals`](Self::store_refusals)).
///
/// Clones of the layer, and every service it makes, share the poison counts
/// and the drop log.
///
/// # In a stack
///
/// Outermost, so that it sees each call's final outcome (see the crate
/// docs' [layer order](crate#layer-order)):
///
/// ```
/// # #[cfg(not(feature = "redb"))] fn main() {}
/// # #[cfg(feature = "redb")]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # use bytes::Bytes;
/// # use http::{Request, Response};
/// # use http_body_util::Full;
/// # use tower::layer::util::Identity;
/// # use tower_poison::ReplayBody;
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("dead-letters.redb");
/// # // Stand-ins: the layers of tower-breaker and tower-retry-budget (see their
/// # // docs) go here.
/// # let (circuit_breaker, retry) = (Identity::new(), Identity::new());
/// # let client = tower::service_fn(|_: Request<ReplayBody<Full<Bytes>>>| async {
/// #     Ok::<_, std::io::Error>(Response::new(Bytes::new()))
/// # });
/// use tower::ServiceBuilder;
/// use tower_poison::store::RedbStore;
///
/// let store = RedbStore::builder().open(&path)?; // /var/lib/orders/dead-letters.redb
/// let layer = tower_poison::DeadLetterLayer::new(store).label("orders");
/// let service = ServiceBuilder::new()
///     .layer(layer)                       // outermost
///     .layer(circuit_breaker)             // tower-breaker
///     .layer(retry)                       // tower-retry-budget
///     .service(client);
/// # drop(service);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct DeadLetterLayer<St, C = HttpClassifier, Cap = HttpCapture> {
    shared: Shared<St, C, Cap>,
}

impl<St> DeadLetterLayer<St> {
    /// A layer writing to `store` with the HTTP defaults.
    ///
    /// It describes the crate's metrics (name, unit, help text) to the
    /// `metrics` recorder installed then ([`describe_metrics`](crate::describe_metrics)).
    pub fn new(store: St) -> Self {
        crate::observability::describe_metrics();
        DeadLetterLayer {
            shared: Shared {
                classifier: HttpClassifier::new(),
                capture: HttpCapture::default(),
                settings: Settings {
                    store,
                    label: Arc::from(DEFAULT_LABEL),
                    action: Action::default(),
                    redactor: Redactor::default(),
                    poison: None,
                    count_store: None,
                    drops: Arc::new(ForgetfulMap::new(LOGGED_KEYS)),
                    stored: FailureKind::ALL.into(),
                },
            },
        }
        .store_refusals(false)
    }

    /// A layer for a server: [`new`](Self::new), storing only the failures
    /// of [`SERVER_KINDS`]; add others with [`store_kinds`](Self::store_kinds)
    /// or [`store_refusals`](Self::store_refusals).
    pub fn for_server(store: St) -> Self {
        Self::new(store).store_kinds(SERVER_KINDS)
    }
}

impl<St, C> DeadLetterLayer<St, C, HttpCapture> {
    /// Keeps at most `limit` bytes of each request body (default 64 KiB):
    /// see [`HttpCapture`] for what happens to a larger one.
    pub fn body_limit(mut self, limit: usize) -> Self {
        self.shared.capture.body_limit = limit;
        self
    }

    /// Reads the message id for poison detection from header `name` (for
    /// example `x-message-id` on a push subscription's requests).
    ///
    /// Like a [`DeliveryCount`] header, the id is believed: it must come
    /// from the queue (or a hop you trust). A caller that can set it can
    /// push another message's count towards the limit, or reset it with a
    /// success.
    pub fn message_id_header(mut self, name: HeaderName) -> Self {
        self.shared.capture.message_id_header = Some(name);
        self
    }

    /// Reads the queue's delivery count from each request with `reader`
    /// (for example [`DeliveryCount::sqs`]); where it finds one, poison
    /// detection uses it instead of the count store. A
    /// [`DeliveryAttempt`](crate::DeliveryAttempt) extension is read with or
    /// without a reader.
    pub fn delivery_count(mut self, reader: DeliveryCount) -> Self {
        self.shared.capture.delivery_count = Some(reader);
        self
    }
}

impl<St, C, Cap> DeadLetterLayer<St, C, Cap> {
    /// Names the service or route in every entry (and metric label).
    pub fn label(mut self, label: impl Into<Arc<str>>) -> Self {
        self.shared.settings.label = label.into();
        self
    }

    /// What to do with a call that finally failed (default [`Action::Dlq`]).
    pub fn action(mut self, action: Action) -> Self {
        self.shared.settings.action = action;
        self
    }

    /// Stores only failures of `kinds`; a failure of any other kind is
    /// handed back as it is, unstored, and counts towards no poison limit.
    /// By default every kind but refusals ([`Shed`](FailureKind::Shed), see
    /// [`store_refusals`](Self::store_refusals)): a client's layer loses
    /// nothing that failed; see [`for_server`](DeadLetterLayer::for_server).
    pub fn store_kinds(mut self, kinds: impl IntoIterator<Item = FailureKind>) -> Self {
        // Each kind once, so the set stays as small as the kinds are few.
        let stored = &mut self.shared.settings.stored;
        stored.clear();
        for kind in kinds {
            if !stored.contains(&kind) {
                stored.push(kind);
            }
        }
        self
    }

    /// Stores refusals that never reached the dependency (`yes`), or
    /// passes them through to the caller unstored (default `false`): a
    /// failure of kind [`Shed`](FailureKind::Shed), such as an open
    /// circuit's `CircuitOpen` or tower's `Overloaded`. It adds or removes
    /// that one kind from the [`store_kinds`](Self::store_kinds) set, so
    /// call it after `store_kinds` or [`for_server`](DeadLetterLayer::for_server).
    ///
    /// The [crate docs](crate#quick-example) say why they are not stored by
    /// default, and when to store them.
    pub fn store_refusals(mut self, yes: bool) -> Self {
        let stored = &mut self.shared.settings.stored;
        stored.retain(|kind| *kind != FailureKind::Shed);
        if yes {
            stored.push(FailureKind::Shed);
        }
        self
    }

    /// Redacts with `redactor`: its headers, query and JSON field names, and
    /// its body and error-text hooks (see [`Redactor`]); the built-in lists
    /// are in every `Redactor`. An error-text hook sees each message
    /// whole, before the message is cut to its bound (see
    /// [`DeadLetterEntry::error`](crate::DeadLetterEntry::error)).
    pub fn redactor(mut self, redactor: Redactor) -> Self {
        self.shared.settings.redactor = redactor;
        self
    }

    /// Turns on poison-message detection (see [`PoisonPolicy`]), counting
    /// in memory unless a [`count_store`](Self::count_store) is set.
    pub fn poison(mut self, policy: PoisonPolicy) -> Self {
        let store = self.shared.settings.count_store.clone();
        self.shared.settings.poison = Some(Arc::new(PoisonCounting::new(policy, store)));
        self
    }

    /// Counts poison detection's deliveries in `store` instead of this
    /// layer's memory, for example a
    /// [`RedisFailureCounts`](crate::counts) shared by every consumer of a
    /// queue. Layers given clones of one store share its counts, so give
    /// each queue its own store (a Redis store is named after its queue):
    /// message ids are unique only within a queue. Set before or after
    /// [`poison`](Self::poison); without it, it has no effect.
    pub fn count_store<F: FailureCountStore>(mut self, store: F) -> Self {
        self.shared.settings.count_store = Some(Arc::new(store));
        match self.shared.settings.poison.as_ref().map(|p| p.policy()) {
            Some(policy) => self.poison(policy),
            None => self,
        }
    }

    /// Uses `classifier` to decide which results are failures.
    ///
    /// For gRPC, pass a [`GrpcClassifier`](tower_classify::GrpcClassifier),
    /// or a classifier built around one (`.map`, `.or`): a call whose status
    /// comes in the trailers is then judged by this classifier where its
    /// response body ends (see [`OpenCall`](crate::OpenCall)).
    pub fn classifier<C2>(self, classifier: C2) -> DeadLetterLayer<St, C2, Cap> {
        let shared = Shared {
            classifier,
            capture: self.shared.capture,
            settings: self.shared.settings,
        };
        DeadLetterLayer { shared }
    }

    /// Uses `capture` to describe requests, for example
    /// [`describe_fn`](crate::describe_fn) for queue messages.
    pub fn capture<Cap2>(self, capture: Cap2) -> DeadLetterLayer<St, C, Cap2> {
        let shared = Shared {
            classifier: self.shared.classifier,
            capture,
            settings: self.shared.settings,
        };
        DeadLetterLayer { shared }
    }
}

impl<S, St, C, Cap> Layer<S> for DeadLetterLayer<St, C, Cap>
where
    St: Clone,
    C: Clone,
    Cap: Clone,
{
    type Service = DeadLetter<S, St, C, Cap>;

    fn layer(&self, inner: S) -> Self::Service {
        DeadLetter::from_shared(inner, Arc::new(self.shared.clone()))
    }
}

impl<St: fmt::Debug, C: fmt::Debug, Cap: fmt::Debug> fmt::Debug for DeadLetterLayer<St, C, Cap> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetterLayer")
            .field("store", &self.shared.settings.store)
            .field("classifier", &self.shared.classifier)
            .field("capture", &self.shared.capture)
            .field("label", &self.shared.settings.label)
            .field("action", &self.shared.settings.action)
            .field("redactor", &self.shared.settings.redactor)
            .field("poison", &self.shared.settings.poison)
            .field("stored", &self.shared.settings.stored)
            .finish()
    }
}
