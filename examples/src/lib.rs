//! Shared pieces of the examples, the demo and the integration tests: a flaky
//! upstream server, an HTTP client service, the naive-retry baseline, a load
//! driver and the demo's chart.

#![warn(missing_docs, rust_2018_idioms)]
#![forbid(unsafe_code)]

pub mod chart;
pub mod client;
pub mod family;
pub mod load;
pub mod naive;
pub mod observability;
pub mod scripted;
pub mod upstream;
