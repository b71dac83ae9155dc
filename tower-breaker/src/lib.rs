#![doc = include_str!("../README.md")]
#![warn(
    missing_debug_implementations,
    missing_docs,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod admin;
#[cfg(feature = "admin")]
mod admin_router;
pub mod answer;
#[cfg(feature = "serde")]
mod config;
mod error;
mod eviction;
pub mod future;
mod instruments;
mod keyed;
mod layer;
mod listeners;
mod machine;
#[cfg(feature = "http")]
mod open;
mod permit;
mod policy;
mod registry;
mod service;
mod settings;
mod share;
mod state;
mod sync;
mod window;
mod word;

pub use self::admin::{BreakerHandle, BreakerSnapshot};
#[cfg(feature = "admin")]
pub use self::admin_router::require_token;
#[cfg(feature = "serde")]
pub use self::config::{AdaptiveThrottleConfig, BreakerConfig, FailureRateConfig, WindowConfig};
pub use self::error::CircuitOpen;
pub use self::instruments::describe_metrics;
pub use self::instruments::MetricsLabel;
pub use self::keyed::{KeyedCircuitBreaker, KeyedCircuitBreakerLayer};
pub use self::layer::{Builder, CircuitBreakerLayer};
#[cfg(feature = "http")]
pub use self::open::OpenCall;
pub use self::policy::{Policy, Window};
pub use self::service::CircuitBreaker;
pub use self::state::{CallEvent, CallKind, Mode, State, StateChange};

#[cfg(doctest)]
/// Which public types are `#[non_exhaustive]`, and the checks that they
/// stay so (each `compile_fail` block must fail; the last block is the
/// control written the allowed way).
///
/// Marked, because they will grow: [`Policy`] and its variants (new trip
/// policies, new settings of a policy), [`Window`], [`Mode`], [`State`],
/// the events ([`StateChange`], [`CallEvent`], [`CallKind`]), the admin
/// snapshot and the configuration structs. None of them is built from a
/// literal outside this crate; each has constructors.
///
/// ```compile_fail
/// let _ = tower_breaker::Policy::ConsecutiveFailures { threshold: 3 };
/// ```
///
/// ```compile_fail
/// use tower_breaker::Mode;
/// fn rejects(mode: Mode) -> bool {
///     match mode {
///         Mode::Enforce => true,
///         Mode::MetricsOnly | Mode::Disabled => false,
///     }
/// }
/// ```
///
/// ```compile_fail
/// use tower_breaker::Window;
/// fn calls(window: Window) -> u32 {
///     match window {
///         Window::Count(n) => n,
///         Window::Time { .. } => 0,
///     }
/// }
/// ```
///
/// ```
/// use tower_breaker::{Mode, Policy, Window};
/// let _ = Policy::consecutive_failures(3);
/// fn rejects(mode: Mode) -> bool {
///     matches!(mode, Mode::Enforce)
/// }
/// fn threshold(policy: Policy) -> Option<u32> {
///     match policy {
///         Policy::ConsecutiveFailures { threshold, .. } => Some(threshold),
///         _ => None,
///     }
/// }
/// fn calls(window: Window) -> u32 {
///     match window {
///         Window::Count(n) => n,
///         _ => 0,
///     }
/// }
/// # assert!(rejects(Mode::Enforce));
/// # assert_eq!(threshold(Policy::consecutive_failures(3)), Some(3));
/// # assert_eq!(calls(Window::count(7)), 7);
/// ```
mod non_exhaustive {}
