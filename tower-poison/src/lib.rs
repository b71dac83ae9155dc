#![doc = include_str!("../README.md")]
#![warn(
    missing_debug_implementations,
    missing_docs,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod action;
mod attempts;
mod capture;
pub mod config;
pub mod counts;
mod entry;
pub mod error;
mod future;
mod layer;
mod observability;
mod open;
mod poison;
mod redact;
mod service;

pub mod replay;
pub mod store;

pub use self::action::Action;
pub use self::attempts::{AttemptCounter, CountAttempts, CountAttemptsLayer, CountedFuture};
pub use self::capture::{
    describe_fn, BodyRecording, CaptureRequest, DescribeFn, DescribeResponse, HttpCapture,
    PendingRecord, RequestRecord,
};
pub use self::counts::{DeliveryAttempt, DeliveryCount};
pub use self::entry::{
    error_chain, DeadLetterEntry, EntryId, EntryIdPrefix, ParseEntryIdError, ReplayRecord,
    StoredHeader,
};
pub use self::error::{CountStoreFailed, PoisonMessage, StoreFailed, StoreFull};
pub use self::future::ResponseFuture;
pub use self::layer::{DeadLetterLayer, SERVER_KINDS};
pub use self::observability::describe_metrics;
pub use self::open::OpenCall;
pub use self::poison::PoisonPolicy;
pub use self::redact::{Redactor, REDACTED};
pub use self::service::DeadLetter;
pub use self::store::{Claim, ClaimToken};
pub use http_body_replay::ReplayBody;
pub use tower_classify::SettleBody;
