//! Redis backends.
