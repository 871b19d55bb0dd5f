//! Reservations on the token bucket: the same TAT word, booked ahead (see
//! `waiting::word_reserve`).

use super::TokenBucket;
use crate::waiting::word_reserve;

word_reserve!(TokenBucket);
// `LockingTokenBucket`'s field is private to `token_bucket::locking`, so its
// reservations are declared there.
