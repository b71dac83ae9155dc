//! How services and calls hold their breaker: a [`BreakerRef`], counted
//! on the calling thread's own share of the breaker.
//!
//! # Why a share per thread
//!
//! Axum and tonic clone the service per request, and a response future holds
//! its permit: two references made and dropped per call. Counted on the
//! breaker's own `Arc`, two threads calling one breaker would bounce that
//! cache line between their cores four times a call: most of a call's cost.
//! So a layer's [`Share`] holds a table of further shares, one per thread
//! (up to a bound), each an `Arc` of its own holding the breaker's `Arc`; a
//! reference made on a thread counts on that thread's share. The shares do
//! not point back to the table, so nothing outlives the layer, its services
//! and their calls.
//!
//! A clone made on one thread and then cloned on others (a per-connection
//! clone made where connections are accepted) holds the first thread's
//! share, without the table: its clones count there from every thread.

use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::machine::Breaker;
use crate::window::thread_stripe;

/// A counted reference to a breaker, as services, layers and permits
/// hold it: cloning it moves the count of the calling thread's own share of
/// the breaker (when this reference hands shares out, as a layer's and the
/// services' it built do), not one that every thread writes.
pub(crate) struct BreakerRef(pub(crate) Arc<Share>);

/// One counted reference to a breaker, with a count of its own.
///
/// Aligned to 128 bytes, as [`Breaker`] is, so that each share's reference
/// count has cache lines to itself: two threads' shares made one after the
/// other would otherwise sit on one line and be written by both.
#[repr(align(128))]
pub(crate) struct Share {
    pub(crate) breaker: Arc<Breaker>,
    /// A layer's share: a share per thread (by [`thread_stripe`]), each made
    /// on the thread's first call. `None` in those shares themselves, and in
    /// a keyed layer's (each key's breaker is looked up per call anyway).
    threads: Option<Box<[OnceLock<Arc<Share>>; THREAD_SHARES]>>,
}

/// Shares a layer hands out, one per thread: threads take numbers in turn,
/// so the threads of a server (the runtime's workers, the blocking pool's)
/// get shares of their own up to this many. Threads beyond share a share:
/// still counted exactly, on lines two of them write. A fixed number, so
/// picking the slot needs no bounds check: 1 KiB of slots per layer, and
/// 256 bytes per share made.
const THREAD_SHARES: usize = 64;

impl Share {
    /// A share of `breaker` without shares of its own to hand out.
    pub(crate) fn new(breaker: Arc<Breaker>) -> Self {
        Share {
            breaker,
            threads: None,
        }
    }

    /// The share a layer holds, handing out a share per thread.
    pub(crate) fn with_thread_shares(breaker: Arc<Breaker>) -> Self {
        Share {
            breaker,
            threads: Some(Box::new([const { OnceLock::new() }; THREAD_SHARES])),
        }
    }
}

impl std::ops::Deref for Share {
    type Target = Breaker;

    #[inline]
    fn deref(&self) -> &Breaker {
        &self.breaker
    }
}

impl Clone for BreakerRef {
    /// A reference counted on this thread's share, when this one hands
    /// shares out (a layer's, a service's the layer built); else on the
    /// same share.
    #[inline]
    fn clone(&self) -> Self {
        let share = match &self.0.threads {
            Some(threads) => threads[thread_stripe() % THREAD_SHARES]
                .get_or_init(|| Arc::new(Share::new(Arc::clone(&self.0.breaker)))),
            None => &self.0,
        };
        BreakerRef(Arc::clone(share))
    }
}

impl BreakerRef {
    /// The breaker.
    #[inline]
    pub(crate) fn breaker(&self) -> &Breaker {
        &self.0.breaker
    }

    /// Another reference to the same share, for what lives long and is
    /// cloned per request (a layer's clone, a service the layer builds): a
    /// layer's keeps handing out shares per thread, where `clone` gives one
    /// that counts on the calling thread's share.
    pub(crate) fn owner(&self) -> Self {
        BreakerRef(Arc::clone(&self.0))
    }
}

impl fmt::Debug for BreakerRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BreakerRef").field(&self.0.key).finish()
    }
}

#[cfg(test)]
#[cfg(not(breaker_loom))]
mod tests {
    use std::future::{ready, Ready};
    use std::sync::Arc;

    use futures_util::FutureExt;
    use tower_classify::ErrorChainClassifier;
    use tower_layer::Layer;
    use tower_service::Service;

    use crate::CircuitBreakerLayer;

    type Answer = Ready<Result<u32, std::io::Error>>;
    type Echo = tower::util::ServiceFn<fn(u32) -> Answer>;

    fn echo(n: u32) -> Answer {
        ready(Ok(n))
    }

    /// How far a reference count (read by `strong_count`) rises while four
    /// clones of `service` and one call on each are alive.
    fn counts_moved<S>(service: &S, strong_count: impl Fn() -> usize) -> usize
    where
        S: Service<u32> + Clone,
    {
        let start = strong_count();
        let mut clones: Vec<S> = (0..4).map(|_| service.clone()).collect();
        let futures: Vec<_> = clones.iter_mut().map(|clone| clone.call(7)).collect();
        let during = strong_count();
        for future in futures {
            assert!(future.now_or_never().is_some());
        }
        during - start
    }

    fn service<L: Layer<Echo>>(layer: &L) -> L::Service {
        layer.layer(tower::service_fn(echo as fn(u32) -> Answer))
    }

    #[test]
    fn calls_count_on_their_threads_share() {
        let layer = CircuitBreakerLayer::new(ErrorChainClassifier::new());
        let breaker = Arc::clone(&layer.breaker.0.breaker);
        let layers_share = Arc::clone(&layer.breaker.0);
        let counted = service(&layer);
        // This thread's share, made by its first reference.
        let this_threads = Arc::clone(&layer.breaker.clone().0);
        assert!(!Arc::ptr_eq(&this_threads, &layers_share));

        // Each clone of the service and each call's permit holds one count
        // of this thread's share; the layer's share and the breaker's own
        // count, which every thread reads, do not move.
        assert_eq!(
            counts_moved(&counted, || Arc::strong_count(&this_threads)),
            8
        );
        assert_eq!(counts_moved(&counted, || Arc::strong_count(&breaker)), 0);
        assert_eq!(
            counts_moved(&counted, || Arc::strong_count(&layers_share)),
            0
        );

        // A clone of the layer hands out the same shares.
        let cloned_layer = layer.clone();
        assert!(Arc::ptr_eq(&cloned_layer.breaker.0, &layers_share));
        assert!(Arc::ptr_eq(&cloned_layer.breaker.clone().0, &this_threads));
        drop(cloned_layer);
    }

    /// The shares keep nothing alive: once the layer, its services and
    /// their calls (on this thread and another) are gone, so is the
    /// breaker.
    #[test]
    fn a_breaker_is_freed_with_its_last_reference() {
        let layer = CircuitBreakerLayer::new(ErrorChainClassifier::new());
        let breaker = Arc::downgrade(&layer.breaker.0.breaker);
        let counted = service(&layer);
        let elsewhere = {
            let counted = counted.clone();
            std::thread::spawn(move || {
                let mut clone = counted.clone();
                let future = clone.call(1);
                (clone, future)
            })
            .join()
            .expect("thread")
        };
        let mut clone = counted.clone();
        let future = clone.call(2);
        drop((layer, counted, clone));
        assert!(breaker.upgrade().is_some(), "calls still hold it");
        assert!(future.now_or_never().is_some());
        drop(elsewhere);
        assert!(breaker.upgrade().is_none(), "nothing holds it");
    }

    /// axum's shape: the router keeps the service the layer built and
    /// clones it for each request, on the thread that serves it. Those
    /// calls count on the thread's share: with four requests in flight,
    /// neither the layer's share nor the breaker's own count has moved
    /// (beyond this thread's share, made by the first).
    #[tokio::test]
    async fn an_axum_routers_calls_count_on_their_threads_share() {
        use axum::error_handling::HandleErrorLayer;
        use axum::http::{Request, StatusCode};
        use axum::routing::get;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::sync::Notify;
        use tower::{ServiceBuilder, ServiceExt};

        let layer = CircuitBreakerLayer::new(ErrorChainClassifier::new());
        let breaker = Arc::clone(&layer.breaker.0.breaker);
        let layers_share = Arc::clone(&layer.breaker.0);
        let release = Arc::new(Notify::new());
        let entered = Arc::new(AtomicUsize::new(0));
        let handler = {
            let (release, entered) = (Arc::clone(&release), Arc::clone(&entered));
            move || async move {
                let released = release.notified();
                entered.fetch_add(1, Ordering::SeqCst);
                released.await
            }
        };
        // Until `n` requests wait in the handler, holding their references.
        let in_flight = |n: usize| {
            let entered = Arc::clone(&entered);
            async move {
                while entered.load(Ordering::SeqCst) < n {
                    tokio::task::yield_now().await;
                }
            }
        };
        let app = axum::Router::new().route("/", get(handler)).layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|_: tower_classify::BoxError| async {
                    StatusCode::SERVICE_UNAVAILABLE
                }))
                .layer(layer),
        );
        let request = || Request::get("/").body(axum::body::Body::empty()).unwrap();
        // The first request makes this thread's share.
        let first = tokio::spawn(app.clone().oneshot(request()));
        in_flight(1).await;
        let (breakers, layers) = (
            Arc::strong_count(&breaker),
            Arc::strong_count(&layers_share),
        );

        let calls: Vec<_> = (0..4)
            .map(|_| tokio::spawn(app.clone().oneshot(request())))
            .collect();
        in_flight(5).await;
        assert_eq!(Arc::strong_count(&breaker), breakers);
        assert_eq!(Arc::strong_count(&layers_share), layers);

        release.notify_waiters();
        for call in calls.into_iter().chain([first]) {
            let response = call.await.unwrap().unwrap();
            assert_eq!(response.status(), StatusCode::OK);
        }
    }
}
