//! Crate-internal access to the fixed window's decision function for the kind
//! layer (`crate::kind`), which runs it on one word per key under a shared,
//! reconfigurable configuration.

pub(crate) use super::counter::WindowCounter;
