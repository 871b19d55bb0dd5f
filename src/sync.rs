//! The one place atomics come from.
//!
//! Every atomic in tollgate is imported through this module: `std`'s normally and
//! loom's when the crate is built with `RUSTFLAGS="--cfg loom"`. The algorithms are
//! therefore model-checked as written, not as a copy (the pattern of tokio's
//! `src/loom/` and crossbeam's `primitive` modules).

#[cfg(not(loom))]
pub(crate) use std::sync::Arc;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
