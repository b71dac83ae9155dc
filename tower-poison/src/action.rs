//! What happens to a call that finally failed.

use std::fmt;
use std::str::FromStr;

use tower_classify::ConfigError;

/// What the dead-letter layer does with a call that finally failed.
///
/// In every case the caller still gets the call's own result: the layer
/// cannot invent a response, and hiding an error would lose it. The action
/// decides what is *kept*:
///
/// | action | stored | counted (`action` label) | logged |
/// |---|---|---|---|
/// | [`Dlq`](Action::Dlq) (default) | yes, before the call returns | yes | every entry (`warn`) |
/// | [`Drop`](Action::Drop) | no | yes | once per key (`warn`), then `debug` |
/// | [`Fail`](Action::Fail) | no | yes | `debug` |
///
/// The names are the configuration names of a queue consumer's poison policy
/// (`action: dlq | drop | fail`); [`FromStr`] reads them.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Action {
    /// Store the entry, then return the call's result. A store that cannot
    /// write turns the call into a [`StoreFailed`](crate::error::StoreFailed)
    /// error: an entry is never lost silently.
    #[default]
    Dlq,
    /// Discard the entry: count it and log it once per key (the label and
    /// failure kind, or the message id).
    Drop,
    /// Store nothing: the failure propagates to the caller as it is.
    Fail,
}

impl Action {
    /// The configuration and metric-label name: `dlq`, `drop` or `fail`.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Action::Dlq => "dlq",
            Action::Drop => "drop",
            Action::Fail => "fail",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Action {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "dlq" => Ok(Action::Dlq),
            "drop" => Ok(Action::Drop),
            "fail" => Ok(Action::Fail),
            other => Err(ConfigError::new(
                "action",
                format!("unknown action {other:?}; expected dlq, drop or fail"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_the_field() {
        for action in [Action::Dlq, Action::Drop, Action::Fail] {
            assert_eq!(action.as_str().parse::<Action>().unwrap(), action);
        }
        let err = "retry".parse::<Action>().unwrap_err();
        assert_eq!(err.field(), "action");
    }
}
