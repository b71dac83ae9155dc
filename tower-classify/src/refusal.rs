//! Proof that a layer refused a request without passing it on.

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};

/// A token, unique to one call, that lets a refusal prove the service
/// behind the refusing layer never saw that call's request.
///
/// An open breaker between an idempotency guard and its handler may free
/// the key; the same `CircuitOpen` from a dependency the handler called
/// after writing must not. Only the request tells them apart, so:
///
/// 1. the guard puts a fresh token in the request's extensions
///    ([`issue`](Self::issue));
/// 2. a layer that refuses a request *without passing it on* copies its
///    token into the refusal's [`Failure`](crate::Failure)
///    ([`with_refusal`](crate::Failure::with_refusal));
/// 3. the guard frees the key only for a failure carrying the token it gave
///    this very request.
///
/// A dependency's refusal answers another request, with no token, and
/// proves nothing; so does a layer that cannot read the request (tower's
/// `LoadShed`): the guard keeps the key, the safe side. A handler that
/// forwards the guarded request itself, extensions and all (a proxy), hands
/// the token on: it must act on nothing before forwarding, or remove it. A
/// layer that sends a request more than once must not hand the token to a
/// later attempt. Tokens come from a per-process counter and never leave the
/// process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RefusalToken(NonZeroU64);

impl RefusalToken {
    /// A token no other call of this process has been given.
    pub fn issue() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        // Relaxed: only uniqueness matters.
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
