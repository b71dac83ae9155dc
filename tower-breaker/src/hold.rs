//! How services and calls hold their breaker: [`Counted`], the default, or
//! [`Leaked`].

use std::fmt;
use std::sync::Arc;

use crate::state::Breaker;

/// How a [`CircuitBreaker`](crate::CircuitBreaker)'s services and response
/// futures hold its breaker: [`Counted`] (the default) or [`Leaked`] (see
/// [`CircuitBreakerLayer::leak`](crate::CircuitBreakerLayer::leak)).
///
/// Sealed: these two types are its only implementations.
// The bound is the crate's own trait, so that no other type implements it.
#[allow(private_bounds)]
pub trait Hold: Holds + Clone + Send + Sync + 'static {}

/// The breaker a [`Hold`] holds.
pub(crate) trait Holds {
    fn breaker(&self) -> &Breaker;
}

/// A breaker held by a reference count: each per-request clone of the
/// service and each call's permit moves the count.
#[derive(Clone)]
pub struct Counted(pub(crate) Arc<Breaker>);

/// A breaker leaked for the rest of the process: a plain `&'static`
/// reference, copied without writing anything.
#[derive(Clone, Copy)]
pub struct Leaked(&'static Breaker);

impl Counted {
    /// This breaker, never freed from now on.
    pub(crate) fn leak(self) -> Leaked {
        // The count stays above zero for good: the breaker outlives every
        // reference, and the registry's reference (the admin handle's) still
        // sees it.
        let kept: &'static Arc<Breaker> = Box::leak(Box::new(self.0));
        Leaked(kept)
    }
}

impl Hold for Counted {}
impl Hold for Leaked {}

impl Holds for Counted {
    #[inline]
    fn breaker(&self) -> &Breaker {
        &self.0
    }
}

impl Holds for Leaked {
    #[inline]
    fn breaker(&self) -> &Breaker {
        self.0
    }
}

impl fmt::Debug for Counted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Counted").field(&self.0.key).finish()
    }
}

impl fmt::Debug for Leaked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Leaked").field(&self.0.key).finish()
    }
}

#[cfg(all(test, not(breaker_loom)))]
mod tests {
    use std::future::{ready, Ready};
    use std::sync::Arc;

    use futures_util::FutureExt;
    use tower_classify::ErrorChainClassifier;
    use tower_layer::Layer;
    use tower_service::Service;

    use crate::CircuitBreakerLayer;

    type Answer = Ready<Result<u32, std::io::Error>>;

    fn echo(n: u32) -> Answer {
        ready(Ok(n))
    }

    /// How far the breaker's reference count (read by `strong_count`)
    /// rises while four clones of a service and one call on each are alive.
    fn counts_moved<L, S>(layer: &L, strong_count: impl Fn() -> usize) -> usize
    where
        L: Layer<tower::util::ServiceFn<fn(u32) -> Answer>, Service = S>,
        S: Service<u32> + Clone,
    {
        let service = layer.layer(tower::service_fn(echo as fn(u32) -> Answer));
        let start = strong_count();
        let mut clones: Vec<S> = (0..4).map(|_| service.clone()).collect();
        let futures: Vec<_> = clones.iter_mut().map(|clone| clone.call(7)).collect();
        let during = strong_count();
        for future in futures {
            assert!(future.now_or_never().is_some());
        }
        during - start
    }

    #[test]
    fn a_leaked_breaker_moves_no_reference_count() {
        let layer = CircuitBreakerLayer::new(ErrorChainClassifier::new());
        let counted = Arc::clone(&layer.breaker.0);
        let strong = || Arc::strong_count(&counted);

        // Counted: each clone of the service and each call's permit holds one.
        assert_eq!(counts_moved(&layer, strong), 8);

        let leaked = layer.leak();
        let after_leak = strong();
        assert_eq!(counts_moved(&leaked, strong), 0);
        assert_eq!(strong(), after_leak, "the leaked reference stays");
    }
}
