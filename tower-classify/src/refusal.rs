//! Proof that a layer refused a request without passing it on.

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};

/// A token, unique to one call, that lets a refusal prove the service
/// behind the refusing layer never saw that call's request.
///
/// An idempotency guard must know whether its handler ran: a refusal made
/// between the guard and the handler (an open breaker, before the handler)
/// may free the key, but the same refusal made *below* the handler (the
/// handler wrote the order, then called a dependency whose breaker was open,
/// and returned its `CircuitOpen` with `?`) must not, or the repeat writes
/// the order again. Kind, type, status and message are identical in both
/// cases; only the request tells them apart. So:
///
/// 1. the guard puts a fresh token in the extensions of the request it
///    hands down ([`issue`](Self::issue));
/// 2. a layer that refuses a request *without passing it on* copies the
///    request's token, if it has one, into its refusal's
///    [`Failure`](crate::Failure)
///    ([`with_refusal`](crate::Failure::with_refusal)), which travels in its
///    error (a [`Classified`](crate::Classified) source) or in its
///    response's extensions;
/// 3. the guard frees the key only for a failure carrying the token it gave
///    this very request.
///
/// A refusal that comes from a dependency the handler called answers
/// *another* request, which the handler built and which carries no token,
/// so it proves nothing, however the handler passes it on. Tokens are
/// drawn from a per-process 64-bit counter, so no two calls share one,
/// and they never leave the process (extensions are not sent).
///
/// Why in the request: it is the one thing that is this call's alone. A
/// mark on the refusal's type or kind (`Shed`) is the same on a dependency's
/// refusal; a scope the guard makes current while it calls or polls the
/// layers below also covers the handler's own calls to its dependencies
/// (and axum calls a route's layers from inside that poll, not from the
/// guard's `call`). Only the request the refusing layer holds ties the
/// refusal to the guard's call. Layers that refuse without being able to
/// read it (tower's `LoadShed`, layers generic over any request type) prove
/// nothing, and a guard keeps the key: the safe side.
///
/// What it cannot see: a handler that forwards the guarded request itself,
/// extensions and all, to a layer that refuses it (a proxy) hands the token
/// on, and that refusal frees the key. Such a handler must act on nothing
/// before forwarding, or remove the token first. A layer that sends a
/// request more than once (a retry) must not hand the token to a later
/// attempt: a refusal of attempt 2 says nothing of attempt 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RefusalToken(NonZeroU64);

impl RefusalToken {
    /// A token no other call of this process has been given.
    pub fn issue() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        // Relaxed: only uniqueness matters, which the atomic increment
        // gives. 2^64 calls would take centuries at any rate.
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        RefusalToken(NonZeroU64::new(n).expect("the counter starts at 1 and never wraps"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_token_is_new() {
        let tokens: std::collections::HashSet<_> =
            (0..1000).map(|_| RefusalToken::issue()).collect();
        assert_eq!(tokens.len(), 1000);
    }
}
