//! Retry budgets: how many retries the whole client may send.
//!
//! `max_retries` bounds one request; a budget caps the retries of every
//! request together at a share of recent traffic, with a floor per second so
//! that a quiet client can still retry (the crate docs' *Budgets* says what
//! that floor means for a fleet). Callers that retry too multiply the
//! factors: without a budget a small outage becomes a retry storm (SRE book
//! chapter 22).
//! When it is spent the retry layer stops at once rather than sleep (see
//! [`BudgetExhausted`](crate::error::BudgetExhausted)).
//!
//! Both budgets here implement tower's [`Budget`] trait, so they also work in a
//! hand-written [`tower::retry::Policy`], and the retry layer accepts tower's
//! own `TpsBudget` or any other implementation.
//!
//! # How the retry layer uses a budget
//!
//! [`Retry`](crate::Retry) calls [`Budget::deposit`] once per request (the
//! first attempt, as Finagle's `RetryFilter` does) and [`Budget::withdraw`]
//! before every retry, once it has decided to retry and before it waits. A
//! retry that is then never sent (the caller dropped the call while it
//! waited, or the service was still not ready when the deadline left no time
//! for an attempt) has spent its withdrawal all the same: tower's [`Budget`]
//! has no refund. A budget is shared through an `Arc` by every clone of the
//! layer and of the service it wraps; pass the same `Arc` to several layers
//! to share one budget among them.

pub(crate) mod token_bucket;
mod tps;

pub use self::token_bucket::TokenBucketBudget;
pub(crate) use self::tps::advance;
pub use self::tps::TpsBudget;
pub use tower::retry::budget::Budget;
