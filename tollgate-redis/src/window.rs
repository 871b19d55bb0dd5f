//! What the fixed window and the sliding-window counter share: a limit per
//! window aligned to the Unix epoch, under a prefix and a name.

use std::time::Duration;

use tollgate::{ConfigError, Rate};

use crate::keys::{DEFAULT_PREFIX, check_name, check_prefix, redis_key};
use crate::limiter::{Kind, Plan};
use crate::micros::validate;
use crate::script::Admission;

/// A window counter's configuration; the kind is the caller's, which picks
/// the script's decision and the key's suffix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) limit: u32,
    /// The window's length in µs.
    pub(crate) window: u64,
    prefix: String,
    pub(crate) name: String,
}

impl Window {
    /// The name is checked first, so a bad name is the error whatever the
    /// rate.
    pub(crate) fn new(name: &str, rate: Rate) -> Result<Self, ConfigError> {
        let name = check_name(name)?;
        let (limit, window) = validate(rate)?;
        Ok(Window {
            limit,
            window,
            prefix: DEFAULT_PREFIX.to_owned(),
            name,
        })
    }

    pub(crate) fn with_prefix(mut self, prefix: &str) -> Result<Self, ConfigError> {
        self.prefix = check_prefix(prefix)?;
        Ok(self)
    }

    pub(crate) fn length(&self) -> Duration {
        Duration::from_micros(self.window)
    }

    pub(crate) fn redis_key(&self, key: &str, suffix: &str) -> String {
        redis_key(&self.prefix, &self.name, key, suffix)
    }

    /// The admission's quota, whole again `after_end` µs after the
    /// admission's window ends.
    pub(crate) fn report(&self, admission: &Admission, after_end: u64) -> tollgate::Snapshot {
        let until_end = self.window - admission.time_us % self.window;
        tollgate::Snapshot::new(
            admission.remaining,
            self.limit,
            Duration::from_micros(until_end.saturating_add(after_end)),
        )
    }

    pub(crate) fn plan(&self, kind: Kind) -> Plan {
        Plan::new(kind, &[self.window, u64::from(self.limit)])
    }
}
