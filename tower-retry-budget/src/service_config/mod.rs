//! gRPC service config retry settings ([gRFC A6]), feature
//! `grpc-service-config`: the value formats a service config is written in.
//!
//! [gRFC A6]: https://github.com/grpc/proposal/blob/master/A6-client-retries.md

pub mod duration;
pub mod status;

pub use self::status::StatusCodes;
