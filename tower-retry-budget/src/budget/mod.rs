//! Retry budgets: how many retries the whole client may send.
//!
//! # Why budgets and not only max retries?
//!
//! `max_retries` bounds one request; it does nothing for the fleet. When a
//! dependency is down, every request fails, every request retries, and a
//! client configured with 3 retries sends *four times* its normal load to a
//! service that is already failing. If that client's callers retry too, the
//! factors multiply: a small outage turns into a self-inflicted denial of
//! service (a "retry storm", SRE book chapter 22).
//!
//! A budget caps retries as a *fraction of the traffic* instead: with the
//! default [`TpsBudget`], retries may add at most 20 % to the requests sent in
//! the last 10 seconds, plus a floor of 10 retries per second so that a quiet
//! client can still retry. The floor is per budget: a fleet of clients that
//! each hold their own budget may add their floors together whatever their
//! traffic, so clients under 50 requests a second each (the floor over the
//! percentage) are held to 20 % only by a floor of zero or by one budget
//! shared among them (the crate's `BENCHMARKS.md` models 1,000 such
//! clients). When the budget is spent, the retry layer stops at
//! once with [`BudgetExhausted`](crate::error::BudgetExhausted) instead of
//! sleeping: the failure is returned to the caller, and no extra load is sent.
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
//!
//! Both budgets are lock-free: the success path is an atomic load and an
//! atomic add, where tower's `TpsBudget` takes a mutex on every call.

pub(crate) mod token_bucket;
mod tps;

pub use self::token_bucket::TokenBucketBudget;
pub use self::tps::TpsBudget;
pub use tower::retry::budget::Budget;
