//! Proof that a layer refused a request without passing it on.

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};

/// A token, unique to one call, that lets a refusal prove the service
/// behind the refusing layer never saw that call's request ([crate
/// docs](crate#refusals-that-prove-the-request-went-no-further)).
///
/// A layer that cannot read the request (tower's `LoadShed`) proves
/// nothing: the guard keeps the key, the safe side. A proxy that forwards
/// the guarded request's extensions hands the token on, so it must act on
/// nothing before forwarding, or remove it; a layer that sends a request
/// more than once must not hand it to a later attempt. Tokens never leave
/// the process.
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
