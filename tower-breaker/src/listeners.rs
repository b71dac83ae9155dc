//! What listens to a breaker's machine: its metric handles (registered once,
//! when it is created, so the hot path never looks a series up), its
//! `tracing` events, and a keyed registry's eviction notices. The machine
//! reports to one [`Observer`]; this is the one the registry gives every
//! breaker.
//!
//! An event shows a key escaped and cut short ([`LoggedKey`]): a client
//! cannot forge a log line with a newline in a host name, nor fill the log.

use std::fmt;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;

use metrics::{Counter, Gauge, SharedString};

use crate::eviction::EvictionNotices;
use crate::machine::{Breaker, Observer, Report};
use crate::state::{State, StateChange};

/// Longer keys are cut (at a character boundary) in events.
const MAX_LOGGED_KEY_BYTES: usize = 128;

/// A key as events show it: `Debug`-escaped (quotes, control characters)
/// and cut at [`MAX_LOGGED_KEY_BYTES`], with the full length appended.
pub(crate) struct LoggedKey<'a>(pub(crate) &'a str);

impl fmt::Debug for LoggedKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = self.0;
        if key.len() <= MAX_LOGGED_KEY_BYTES {
            return write!(f, "{key:?}");
        }
        let mut cut = MAX_LOGGED_KEY_BYTES;
        while !key.is_char_boundary(cut) {
            cut -= 1;
        }
        write!(f, "{:?}… ({} bytes)", &key[..cut], key.len())
    }
}

/// Emits a breaker's event at `$level` with the `breaker` (layer name)
/// field and, for a keyed breaker, the `key` field; the rest is passed to
/// `tracing` as is.
macro_rules! breaker_event {
    ($level:ident, $breaker:expr, $($rest:tt)+) => {{
        let breaker: &$crate::machine::Breaker = $breaker;
        if breaker.keyed {
            ::tracing::$level!(
                breaker = %breaker.settings.name,
                key = ?$crate::listeners::LoggedKey(&breaker.key),
                $($rest)+
            )
        } else {
            ::tracing::$level!(breaker = %breaker.settings.name, $($rest)+)
        }
    }};
}

pub(crate) use breaker_event;

/// A breaker's listeners.
pub(crate) struct Listeners {
    state: Gauge,
    forced: Gauge,
    opened: Counter,
    rejected: Counter,
    would_reject: Counter,
    /// The label is this breaker's alone, so its gauge may be reset when
    /// the breaker is evicted without hiding another breaker's state.
    own_label: bool,
    /// A keyed breaker's registry, told when the breaker opens and when it
    /// closes again.
    notices: Option<Arc<EvictionNotices>>,
    /// Evicted from its registry (or never kept): it stops reporting its
    /// state, so a late result cannot bring back an evicted key's series.
    retired: AtomicBool,
}

impl Listeners {
    /// Registers the breaker's handles, labelled `label`, with the recorder
    /// installed now.
    pub(crate) fn new(
        label: SharedString,
        own_label: bool,
        notices: Option<Arc<EvictionNotices>>,
    ) -> Self {
        Listeners {
            state: metrics::gauge!("tower_breaker_state", "breaker" => label.clone()),
            forced: metrics::gauge!("tower_breaker_forced", "breaker" => label.clone()),
            opened: metrics::counter!("tower_breaker_opened_total", "breaker" => label.clone()),
            rejected: metrics::counter!("tower_breaker_rejected_total", "breaker" => label.clone()),
            would_reject: metrics::counter!("tower_breaker_would_reject_total", "breaker" => label),
            own_label,
            notices,
            retired: AtomicBool::new(false),
        }
    }

    fn set_state(&self, state: State) {
        self.state.set(state.gauge_value());
        self.forced.set(if state.is_forced() { 1.0 } else { 0.0 });
    }

    /// A state this breaker may show only under a label of its own: its
    /// first once the registry keeps it (a new breaker must not hide the
    /// state of another sharing the label), and closed once evicted (what a
    /// new breaker for the key would start at, so a dashboard counting open
    /// breakers forgets it).
    fn set_own_state(&self, state: State) {
        if self.own_label {
            self.set_state(state);
        }
    }

    fn changed(&self, breaker: &Breaker, change: StateChange<'_>, by_operator: bool) {
        let StateChange {
            from, to, open_for, ..
        } = change;
        if to == State::Open {
            self.opened.increment(1);
            // The call whose failure opened it used it last.
            if let Some(notices) = &self.notices {
                notices.stamp(&breaker.open_used);
            }
        }
        self.gauge(to);
        if to == State::Closed && from != State::Closed {
            if let Some(notices) = &self.notices {
                if !breaker.notice_posted.swap(true, Ordering::Relaxed) {
                    notices.post_closed(&breaker.key);
                }
            }
        }
        let (from, to_name) = (from.as_str(), to.as_str());
        match (to, by_operator) {
            (State::Open | State::ForcedOpen, false) => breaker_event!(
                warn,
                breaker,
                from,
                to = to_name,
                open_for = ?open_for,
                "circuit breaker opened"
            ),
            // An operator's decision is worth a line whatever it is; opening
            // still warns, since it sheds the dependency's whole traffic.
            (State::ForcedOpen, true) => breaker_event!(
                warn,
                breaker,
                from,
                to = to_name,
                "circuit breaker forced open by an operator"
            ),
            _ => {
                let message = match by_operator {
                    false => "circuit breaker state changed",
                    true => "circuit breaker state set by an operator",
                };
                breaker_event!(info, breaker, from, to = to_name, "{message}")
            }
        }
    }

    fn gauge(&self, state: State) {
        if self.retired.load(Ordering::Relaxed) {
            return;
        }
        self.set_state(state);
        // An eviction may have retired the breaker while this write was
        // under way, its reset to closed landing first: then this write left
        // an evicted key's series at a state nothing will update. Look again
        // and reset it once more. The fences pair with `let_go`'s: if this
        // load misses the flag, this write is ordered before the reset.
        fence(Ordering::SeqCst);
        if self.retired.load(Ordering::Relaxed) {
            self.set_own_state(State::Closed);
        }
    }

    /// The registry let go of the breaker. Calls still in flight may finish
    /// on it; it no longer reports its state.
    fn let_go(&self) {
        self.retired.store(true, Ordering::Relaxed);
        // See `gauge`: a state write racing this one is redone as a reset.
        fence(Ordering::SeqCst);
        self.set_own_state(State::Closed);
    }
}

impl Observer for Listeners {
    fn report(&self, breaker: &Breaker, report: Report<'_>) {
        match report {
            Report::Changed {
                change,
                by_operator,
            } => self.changed(breaker, change, by_operator),
            Report::ProbeAdmitted { probe } => breaker_event!(
                debug,
                breaker,
                probe,
                probes = breaker.settings.probes,
                "circuit breaker admitted a half-open probe"
            ),
            Report::ProbesLapsed => breaker_event!(
                warn,
                breaker,
                probe_timeout = ?breaker.settings.probe_timeout,
                "half-open probes did not answer in time; reopening"
            ),
            Report::Rejected { remaining } => {
                self.rejected.increment(1);
                // Per call, so never above `debug`: an outage must not turn
                // every refused request into a log line; the state change
                // was logged.
                breaker_event!(
                    debug,
                    breaker,
                    remaining = ?remaining,
                    "circuit breaker rejected a call"
                );
            }
            Report::WouldReject { state } => {
                self.would_reject.increment(1);
                breaker_event!(
                    debug,
                    breaker,
                    state = state.as_str(),
                    "circuit breaker would reject a call (metrics-only mode lets it through)"
                );
            }
            Report::Kept(state) => self.set_own_state(state),
            Report::LetGo => self.let_go(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_escaped_and_a_long_one_cut_at_a_character_boundary() {
        assert_eq!(
            format!("{:?}", LoggedKey("evil\nbreaker=forged")),
            r#""evil\nbreaker=forged""#
        );
        let long = "é".repeat(100); // 200 bytes
        let shown = format!("{:?}", LoggedKey(&long));
        assert_eq!(shown, format!("{:?}… (200 bytes)", "é".repeat(64)));
    }
}
