//! Async waiting on tokio's timer (the `tokio` feature).

use std::time::Duration;

use super::sealed::RawReserve;
use super::{Reservation, Reserve};
use crate::error::Denied;

/// Cancels the reservation it holds when dropped: what makes dropping an
/// unfinished `acquire_async` future give its permits back.
struct CancelOnDrop<'a, L: RawReserve + ?Sized>(Option<Reservation<'a, L>>);

impl<L: RawReserve + ?Sized> Drop for CancelOnDrop<'_, L> {
    fn drop(&mut self) {
        if let Some(reservation) = self.0.take() {
            let _ = reservation.cancel();
        }
    }
}

pub(super) async fn wait<L: RawReserve + ?Sized>(reservation: Reservation<'_, L>) {
    let guard = CancelOnDrop(Some(reservation));
    loop {
        // `guard.0` is only emptied below, after the last await.
        let delay = guard.0.as_ref().map_or(Duration::ZERO, Reservation::delay);
        if delay.is_zero() {
            break;
        }
        // An early wake-up, or a clock slower than tokio's, loops once more.
        tokio::time::sleep(delay).await;
    }
    let mut guard = guard;
    // Granted: the permits are the caller's now, so nothing to cancel.
    guard.0 = None;
}

pub(super) async fn acquire<L: Reserve + ?Sized>(
    limiter: &L,
    n: u32,
    max_wait: Duration,
) -> Result<(), Denied> {
    limiter.reserve_within(n, max_wait)?.wait_async().await;
    Ok(())
}
