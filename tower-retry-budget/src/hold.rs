//! How services and calls hold a retry layer's settings: [`Counted`], the
//! default, or [`Leaked`].

use std::fmt;
use std::sync::Arc;

use crate::policy::Policy;

/// How a [`Retry`](crate::Retry)'s services and response futures hold the
/// layer's settings, classifier and budget: [`Counted`] (the default) or
/// [`Leaked`] (see [`RetryLayer::leak`](crate::RetryLayer::leak)).
///
/// Sealed: these two types are its only implementations. Both are `Send`,
/// `Sync` and `'static` when the classifier `C` and the replay `R` are
/// (what a service spawned on a multi-threaded runtime needs); code generic
/// over the hold states those bounds itself.
// The bound is the crate's own trait, so that no other type implements it.
#[allow(private_bounds)]
pub trait Hold<C, R>: Holds<C, R> + Clone {}

/// The settings a [`Hold`] holds.
pub(crate) trait Holds<C, R> {
    fn policy(&self) -> &Policy<C, R>;
}

/// Settings held by a reference count: each per-request clone of the
/// service and each call's response future moves the count.
pub struct Counted<C, R>(pub(crate) Arc<Policy<C, R>>);

/// Settings leaked for the rest of the process: a plain `&'static`
/// reference, copied without writing anything.
pub struct Leaked<C: 'static, R: 'static>(&'static Policy<C, R>);

impl<C, R> Counted<C, R> {
    /// These settings, never freed from now on.
    pub(crate) fn leak(self) -> Leaked<C, R> {
        // The count stays above zero for good: the settings outlive every
        // reference, including the services made before the leak.
        let kept: &'static Arc<Policy<C, R>> = Box::leak(Box::new(self.0));
        Leaked(kept)
    }
}

impl<C, R> Clone for Counted<C, R> {
    #[inline]
    fn clone(&self) -> Self {
        Counted(Arc::clone(&self.0))
    }
}

impl<C, R> Clone for Leaked<C, R> {
    #[inline]
    fn clone(&self) -> Self {
        *self
    }
}

impl<C, R> Copy for Leaked<C, R> {}

impl<C, R> Hold<C, R> for Counted<C, R> {}
impl<C, R> Hold<C, R> for Leaked<C, R> {}

impl<C, R> Holds<C, R> for Counted<C, R> {
    #[inline]
    fn policy(&self) -> &Policy<C, R> {
        &self.0
    }
}

impl<C, R> Holds<C, R> for Leaked<C, R> {
    #[inline]
    fn policy(&self) -> &Policy<C, R> {
        self.0
    }
}

impl<C, R> fmt::Debug for Counted<C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Counted")
            .field(&self.0.telemetry.name())
            .finish()
    }
}

impl<C, R> fmt::Debug for Leaked<C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Leaked")
            .field(&self.0.telemetry.name())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::future::{ready, Future, Ready};
    use std::pin::pin;
    use std::sync::Arc;
    use std::task::{Context, Waker};

    use tower_layer::Layer;
    use tower_service::Service;

    use crate::RetryLayer;

    type Answer = Ready<Result<u32, std::io::Error>>;

    fn echo(n: u32) -> Answer {
        ready(Ok(n))
    }

    /// How far the settings' reference count (read by `strong_count`)
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
        let mut cx = Context::from_waker(Waker::noop());
        for future in futures {
            assert!(pin!(future).poll(&mut cx).is_ready());
        }
        during - start
    }

    #[test]
    fn leaked_settings_move_no_reference_count() {
        let layer = RetryLayer::builder().build().unwrap();
        let counted = Arc::clone(&layer.held().0);
        let strong = || Arc::strong_count(&counted);

        // Counted: each clone of the service and each call's future holds one.
        assert_eq!(counts_moved(&layer, strong), 8);

        let leaked = layer.leak();
        let after_leak = strong();
        assert_eq!(counts_moved(&leaked, strong), 0);
        assert_eq!(strong(), after_leak, "the leaked reference stays");
    }
}
