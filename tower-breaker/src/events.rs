//! The `tracing` events of a breaker, and the fields they all carry.
//!
//! A key is shown escaped and cut short ([`LoggedKey`]): a client cannot
//! forge a log line with a newline in a host name, nor fill the log.

use std::fmt;

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
                key = ?$crate::events::LoggedKey(&breaker.key),
                $($rest)+
            )
        } else {
            ::tracing::$level!(breaker = %breaker.settings.name, $($rest)+)
        }
    }};
}

pub(crate) use breaker_event;

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
