//! gRPC status codes as a service config names them: `"UNAVAILABLE"`,
//! `"unavailable"` or `14`.

use std::fmt;

/// The gRPC status codes 0–16, by number, as the gRPC status code list
/// (`doc/statuscodes.md` in `grpc/grpc`) names them.
pub(crate) const STATUS_CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The number of the status called `name`, compared without regard to
/// ASCII case as [gRFC A6] asks (`"UNAVAILABLE"` and `"unavailable"` are
/// both 14). `None` for any other name.
///
/// [gRFC A6]: https://github.com/grpc/proposal/blob/master/A6-client-retries.md
pub(crate) fn status_code_from_name(name: &str) -> Option<u32> {
    STATUS_CODE_NAMES
        .iter()
        .position(|known| known.eq_ignore_ascii_case(name))
        .map(|code| code as u32)
}

/// The name of status `code`, `None` above 16.
pub(crate) fn status_code_name(code: u32) -> Option<&'static str> {
    STATUS_CODE_NAMES.get(code as usize).copied()
}

/// A set of gRPC status codes (0–16), such as a policy's
/// `retryableStatusCodes`. `Copy`: one bit per code.
///
/// ```
/// use tower_retry_budget::service_config::StatusCodes;
///
/// let codes = StatusCodes::EMPTY.with(14).unwrap().with(13).unwrap();
/// assert_eq!(format!("{codes}"), "INTERNAL, UNAVAILABLE");
/// assert!(StatusCodes::EMPTY.with(17).is_none());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StatusCodes {
    bits: u32,
}

impl StatusCodes {
    /// No code.
    pub const EMPTY: StatusCodes = StatusCodes { bits: 0 };

    /// The set with `code` added; `None` when `code` is not a gRPC status
    /// code (above 16).
    pub const fn with(self, code: u32) -> Option<Self> {
        if code as usize >= STATUS_CODE_NAMES.len() {
            return None;
        }
        Some(StatusCodes {
            bits: self.bits | (1 << code),
        })
    }

    /// `true` when `code` is in the set.
    pub(crate) const fn contains(self, code: u32) -> bool {
        code < 32 && self.bits & (1 << code) != 0
    }

    /// `true` for the empty set.
    pub(crate) const fn is_empty(self) -> bool {
        self.bits == 0
    }

    /// How many codes the set holds.
    #[cfg(test)]
    pub(crate) const fn len(self) -> usize {
        self.bits.count_ones() as usize
    }

    /// The codes, smallest first.
    pub(crate) fn iter(self) -> impl Iterator<Item = u32> {
        (0..STATUS_CODE_NAMES.len() as u32).filter(move |&code| self.contains(code))
    }
}

impl fmt::Debug for StatusCodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.iter().filter_map(status_code_name))
            .finish()
    }
}

/// The names, smallest code first, separated by `, `.
impl fmt::Display for StatusCodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<_> = self.iter().filter_map(status_code_name).collect();
        f.write_str(&names.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_agree_in_any_case() {
        for (code, name) in STATUS_CODE_NAMES.iter().enumerate() {
            assert_eq!(status_code_from_name(name), Some(code as u32));
            assert_eq!(
                status_code_from_name(&name.to_ascii_lowercase()),
                Some(code as u32)
            );
            assert_eq!(status_code_name(code as u32), Some(*name));
        }
        assert_eq!(status_code_from_name("Unavailable"), Some(14));
        assert_eq!(status_code_from_name("UNAVAILABLE "), None);
        assert_eq!(
            status_code_from_name("CANCELED"),
            None,
            "gRPC spells it CANCELLED"
        );
        assert_eq!(status_code_from_name(""), None);
        assert_eq!(status_code_name(17), None);
        assert_eq!(status_code_name(u32::MAX), None);
    }

    #[test]
    fn a_set_holds_exactly_its_codes() {
        let all = (0..17).fold(StatusCodes::EMPTY, |set, code| set.with(code).unwrap());
        assert_eq!(all.len(), 17);
        assert!(!all.contains(17) && !all.contains(31) && !all.contains(u32::MAX));
        let one = StatusCodes::EMPTY.with(16).unwrap();
        assert_eq!(one.iter().collect::<Vec<_>>(), [16]);
        assert_eq!(format!("{one:?}"), "{\"UNAUTHENTICATED\"}");
        assert!(StatusCodes::EMPTY.is_empty());
        assert!(StatusCodes::EMPTY.with(u32::MAX).is_none());
    }
}
