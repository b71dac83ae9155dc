//! The state word: a breaker's whole state in one `AtomicU64`.
//!
//! # Why one word
//!
//! The state, the half-open probe slots claimed so far, the probe successes and
//! failures, and an *epoch* (bumped on every transition) share one `AtomicU64`.
//! So:
//!
//! - the closed path is one atomic load on entry (is it closed?) and, under the
//!   default policy, one on completion (is the failure count already zero?);
//! - claiming a probe slot is a compare-and-swap on that word, so across every
//!   clone of the service exactly `probes` calls are admitted per half-open
//!   period, and the transition open → half-open and the first claim are the
//!   same CAS (no window where the state is half-open with slots unclaimed by
//!   the caller that opened it);
//! - a result carries the epoch it was admitted in, and only counts where that
//!   epoch is still current: a slow call admitted while closed cannot close a
//!   later half-open breaker, nor can a stale probe reopen a fresh one.
//!
//! This module only encodes and decodes the word; `machine.rs` loads it,
//! swaps it, and decides the transitions.

use crate::state::State;

/// The state word's code for a breaker that closed less than its
/// [slow start](crate::Builder::slow_start) ago: closed, but off the
/// one-load closed path, admitting a rising share of calls.
const SLOW_START_CODE: u64 = 6;

/// The state word's code for a closed breaker under
/// [`Policy::AdaptiveThrottle`](crate::Policy::AdaptiveThrottle): closed, but
/// not the closed code, so that its calls leave the one-load closed path and
/// draw against the throttle.
const THROTTLING_CODE: u64 = 5;

/// A state's code in the word's low bits.
const fn code(state: State) -> u64 {
    match state {
        State::Closed => 0,
        State::Open => 1,
        State::HalfOpen => 2,
        State::ForcedOpen => 3,
        State::ForcedClosed => 4,
    }
}

/// The state a code stands for: a throttling or slow-starting breaker is
/// closed.
const fn state_of(code: u64) -> State {
    match code {
        THROTTLING_CODE | SLOW_START_CODE => State::Closed,
        1 => State::Open,
        2 => State::HalfOpen,
        3 => State::ForcedOpen,
        4 => State::ForcedClosed,
        _ => State::Closed,
    }
}

// Layout of the state word, low bits first.
const STATE_BITS: u32 = 3;
const SLOT_BITS: u32 = 12;
const CLAIMED_SHIFT: u32 = STATE_BITS;
const SUCCEEDED_SHIFT: u32 = STATE_BITS + SLOT_BITS;
const FAILED_SHIFT: u32 = STATE_BITS + 2 * SLOT_BITS;
const EPOCH_SHIFT: u32 = STATE_BITS + 3 * SLOT_BITS;
const STATE_MASK: u64 = (1 << STATE_BITS) - 1;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
const EPOCH_MASK: u64 = (1 << (64 - EPOCH_SHIFT)) - 1;
/// The most probe slots a half-open breaker can have.
pub(crate) const MAX_PROBES: u32 = SLOT_MASK as u32;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Word(pub(crate) u64);

impl Word {
    pub(crate) const fn new(state: State, epoch: u64, slots: Slots) -> Word {
        Word(
            code(state)
                | (slots.claimed & SLOT_MASK) << CLAIMED_SHIFT
                | (slots.succeeded & SLOT_MASK) << SUCCEEDED_SHIFT
                | (slots.failed & SLOT_MASK) << FAILED_SHIFT
                | (epoch & EPOCH_MASK) << EPOCH_SHIFT,
        )
    }
    pub(crate) const fn state(self) -> State {
        state_of(self.0 & STATE_MASK)
    }
    /// `state() == State::Closed` without decoding the state: the test
    /// every closed-path call makes.
    #[inline]
    pub(crate) const fn is_closed(self) -> bool {
        self.0 & STATE_MASK == code(State::Closed)
    }
    pub(crate) const fn is_slow_starting(self) -> bool {
        self.0 & STATE_MASK == SLOW_START_CODE
    }
    /// Closed, whichever way: its calls are counted towards opening.
    pub(crate) const fn counts_calls(self) -> bool {
        let bits = self.0 & STATE_MASK;
        bits == code(State::Closed) || bits == SLOW_START_CODE
    }
    /// This word with the plain closed code.
    pub(crate) const fn plainly_closed(self) -> Word {
        Word(self.0 & !STATE_MASK | code(State::Closed))
    }
    /// This closed word, as a breaker in its slow start writes it.
    pub(crate) const fn slow_starting(self) -> Word {
        Word(self.0 & !STATE_MASK | SLOW_START_CODE)
    }
    pub(crate) const fn is_throttling(self) -> bool {
        self.0 & STATE_MASK == THROTTLING_CODE
    }
    /// This closed word, as a throttling breaker writes it.
    pub(crate) const fn throttling(self) -> Word {
        Word(self.0 & !STATE_MASK | THROTTLING_CODE)
    }
    pub(crate) const fn epoch(self) -> u64 {
        self.0 >> EPOCH_SHIFT
    }
    pub(crate) const fn claimed(self) -> u64 {
        (self.0 >> CLAIMED_SHIFT) & SLOT_MASK
    }
    pub(crate) const fn slots(self) -> Slots {
        Slots {
            claimed: self.claimed(),
            succeeded: (self.0 >> SUCCEEDED_SHIFT) & SLOT_MASK,
            failed: (self.0 >> FAILED_SHIFT) & SLOT_MASK,
        }
    }
    /// The first word of the next state: a new epoch, no slots in use.
    pub(crate) const fn next(self, state: State) -> Word {
        Word::new(state, self.epoch() + 1, Slots::NONE)
    }
    /// A half-open word with other slots. Only for half-open words: it
    /// rebuilds the code from the decoded state, which would turn a
    /// throttling or slow-starting closed word into a plain closed one.
    pub(crate) const fn with_slots(self, slots: Slots) -> Word {
        Word::new(self.state(), self.epoch(), slots)
    }
}

/// A half-open period's probe slots: claimed, and of those, answered.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slots {
    pub(crate) claimed: u64,
    pub(crate) succeeded: u64,
    pub(crate) failed: u64,
}

impl Slots {
    pub(crate) const NONE: Slots = Slots {
        claimed: 0,
        succeeded: 0,
        failed: 0,
    };
}
