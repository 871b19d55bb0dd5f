//! The leased limiter's two scripts, on the token bucket's state: take a
//! lease (`lease.lua`), give one back (`lease_return.lua`); their calls and
//! what they answer.

// The replies are public under `test-time` (re-exported by `leased`), for
// the tests that replay the scripts.
#![cfg_attr(not(feature = "test-time"), allow(unreachable_pub))]

use crate::client::Client;
use crate::error::Error;
use crate::script::{LuaScript, Reply, reply};
#[cfg(feature = "test-time")]
use crate::{limiter::Limiter, token_bucket::TokenBucket};

static LEASE: LuaScript = LuaScript { name: "lease" };
static RETURN: LuaScript = LuaScript {
    name: "lease_return",
};

/// What the lease script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseReply {
    /// `granted` permits (at least 1) were debited from the budget at server
    /// time `time_us` (µs since the Unix epoch), leaving its theoretical
    /// arrival time at `tat` (µs): the value a return must find.
    Granted {
        /// The debit's server time, µs since the Unix epoch.
        time_us: u64,
        /// Permits debited.
        granted: u64,
        /// The budget's theoretical arrival time after the debit, µs.
        tat: u64,
    },
    /// The budget had no permit; the next is due `wait_us` µs later.
    Exhausted {
        /// The wait for the next permit, µs.
        wait_us: u64,
    },
}

/// What the return script answered: `returned` permits given back (0 when
/// the lease is no longer the budget's last debit), leaving the budget's
/// theoretical arrival time at `tat` (µs; 0 for a budget with no state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReturnReply {
    /// The return's server time, µs since the Unix epoch.
    pub time_us: u64,
    /// Permits given back.
    pub returned: u64,
    /// The budget's theoretical arrival time afterwards, µs.
    pub tat: u64,
}

/// A lease call's configuration: the bucket's GCRA terms (µs) and the tail
/// rule (below `low_water` permits left, at most `ceil(left / share)`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms {
    pub(crate) interval_us: u64,
    pub(crate) tolerance_us: u64,
    pub(crate) low_water: u64,
    pub(crate) share: u64,
}

/// Asks for up to `want` permits of the budget at `key`, at the server's time
/// (`now_us`: `None`) or at a replayed one.
pub(crate) async fn lease(
    client: &Client,
    key: &str,
    want: u64,
    terms: Terms,
    now_us: Option<u64>,
) -> Result<LeaseReply, Error> {
    let args = [
        want,
        terms.interval_us,
        terms.tolerance_us,
        terms.low_water,
        terms.share,
    ];
    match reply(client.eval(&LEASE, key, &args, now_us).await?, key)? {
        Reply::Done {
            time_us,
            count,
            value,
        } => Ok(LeaseReply::Granted {
            time_us,
            granted: count,
            tat: value,
        }),
        Reply::Refused { wait_us, .. } => Ok(LeaseReply::Exhausted { wait_us }),
    }
}

/// Gives `unused` permits back to the budget at `key` if the lease that left
/// its TAT at `lease_tat` is still its last debit. `interval_us` and
/// `tolerance_us` are the budget's GCRA terms: the script checks the state
/// it finds as a decision would.
pub(crate) async fn give_back(
    client: &Client,
    key: &str,
    unused: u64,
    [interval_us, tolerance_us]: [u64; 2],
    lease_tat: u64,
    now_us: Option<u64>,
) -> Result<ReturnReply, Error> {
    let args = [unused, interval_us, lease_tat, tolerance_us];
    match reply(client.eval(&RETURN, key, &args, now_us).await?, key)? {
        Reply::Done {
            time_us,
            count,
            value,
        } => Ok(ReturnReply {
            time_us,
            returned: count,
            tat: value,
        }),
        refused @ Reply::Refused { .. } => Err(Error::UnexpectedReply(format!(
            "the return script refused: {refused:?}"
        ))),
    }
}

/// The lease scripts at a replayed time, beside
/// [`Client::try_acquire_n_at`](Client::try_acquire_n_at).
#[cfg(feature = "test-time")]
impl Client {
    /// Runs the [`LeasedLimiter`](crate::LeasedLimiter)'s lease script once
    /// on `bucket`'s state for `key`, at a time the caller gives (µs since
    /// the Unix epoch): up to `want` permits, at most `ceil(left / share)`
    /// while fewer than `low_water` are left. For tests that replay a
    /// timeline through the script and a model of it. Only under the
    /// `test-time` feature.
    #[cfg(feature = "test-time")]
    pub async fn lease_at(
        &self,
        bucket: &TokenBucket,
        key: &str,
        want: u64,
        (low_water, share): (u64, u64),
        now_us: u64,
    ) -> Result<LeaseReply, Error> {
        let [interval_us, tolerance_us] = bucket.terms();
        let terms = Terms {
            interval_us,
            tolerance_us,
            low_water,
            share,
        };
        lease(self, &bucket.redis_key(key), want, terms, Some(now_us)).await
    }

    /// Runs the [`LeasedLimiter`](crate::LeasedLimiter)'s return script once
    /// on `bucket`'s state for `key`, at a time the caller gives: gives
    /// `unused` permits back if the lease that left the budget's TAT at
    /// `lease_tat` is still its last debit. For tests, as
    /// [`Client::lease_at`]. Only under the `test-time` feature.
    #[cfg(feature = "test-time")]
    pub async fn return_lease_at(
        &self,
        bucket: &TokenBucket,
        key: &str,
        unused: u64,
        lease_tat: u64,
        now_us: u64,
    ) -> Result<ReturnReply, Error> {
        let key = bucket.redis_key(key);
        give_back(self, &key, unused, bucket.terms(), lease_tat, Some(now_us)).await
    }
}
