//! The right to make one call: taken when the breaker admits it, given back
//! when its result is recorded or, for an unanswered probe, when it is dropped.

use std::fmt;
use std::time::Duration;

use tower_classify::Outcome;

use crate::error::CircuitOpen;
use crate::machine::{Admission, Breaker};
use crate::share::BreakerRef;

impl Breaker {
    /// Admits a call or refuses it. The closed path is one atomic load.
    #[inline]
    pub(crate) fn admit(holder: &BreakerRef) -> Result<Permit, CircuitOpen> {
        let word = holder.breaker().load();
        let admission = if word.is_closed() {
            Admission::new(word.epoch(), false)
        } else {
            holder.breaker().admit_slow(word)?
        };
        Ok(Permit {
            breaker: holder.clone(),
            bits: admission.epoch << 2 | u64::from(admission.probe) << 1,
        })
    }
}

/// The right to make one call, taken in [`Breaker::admit`]. Completing it
/// records the result; dropping an uncompleted probe permit gives its slot
/// back, so a cancelled probe cannot wedge the breaker half-open.
pub(crate) struct Permit {
    breaker: BreakerRef,
    /// `epoch << 2 | probe << 1 | done`. One word rather than three fields:
    /// the permit is written once and copied whole, and mixed-width fields
    /// made that copy stall on store forwarding in the closed-path bench.
    bits: u64,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("key", &self.breaker().key)
            .field("epoch", &self.epoch())
            .field("probe", &self.is_probe())
            .finish()
    }
}

impl Permit {
    const DONE: u64 = 1;
    const PROBE: u64 = 2;

    #[inline]
    pub(crate) fn breaker(&self) -> &Breaker {
        self.breaker.breaker()
    }

    fn epoch(&self) -> u64 {
        self.bits >> 2
    }

    fn is_probe(&self) -> bool {
        self.bits & Self::PROBE != 0
    }

    #[inline]
    pub(crate) fn complete(&mut self, outcome: Outcome, elapsed: Option<Duration>) {
        if self.bits & Self::DONE != 0 {
            return;
        }
        self.bits |= Self::DONE;
        self.breaker()
            .complete(self.epoch(), self.is_probe(), outcome, elapsed);
    }
}

impl Drop for Permit {
    #[inline]
    fn drop(&mut self) {
        if self.bits & (Self::DONE | Self::PROBE) == Self::PROBE {
            self.breaker().give_back_probe(self.epoch());
        }
    }
}
