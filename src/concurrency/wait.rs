//! Waiting for a permit: the future (any executor; no timer) and the blocking
//! wait (parks the thread). Both are loops over [`Gate::wait_step`]; the
//! protocol that makes them lose no wake-up is in the `gate` module's docs.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::gate::{Gate, Granted, Step};
use crate::cell::StateCell;
use crate::sync::park;

/// Resolves to a permit's report once its own CAS admits it. Dropping it
/// leaves the queue, passing on a wake-up it had been given (`Gate::leave`):
/// cancel-safe at every await point, and holding no permit until it is ready.
#[derive(Debug)]
pub(crate) struct Acquire<'a, S: StateCell<Word = u64>> {
    gate: &'a Gate<S>,
    /// Queued under this id (asleep or woken), until it completes.
    id: Option<u64>,
}

impl<'a, S: StateCell<Word = u64>> Acquire<'a, S> {
    pub(crate) fn new(gate: &'a Gate<S>) -> Self {
        Acquire { gate, id: None }
    }
}

impl<S: StateCell<Word = u64>> Future for Acquire<'_, S> {
    type Output = Granted;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Granted> {
        if self.id.is_none() {
            // A first poll tries the lock-free path before the queue's lock.
            if let Some(granted) = self.gate.try_acquire() {
                return Poll::Ready(granted);
            }
        }
        match self.gate.wait_step(self.id, Some(cx.waker())) {
            Step::Acquired(granted) => {
                // Out of the queue: nothing for `drop` to do.
                self.id = None;
                Poll::Ready(granted)
            }
            Step::Asleep(id) => {
                self.id = Some(id);
                Poll::Pending
            }
        }
    }
}

impl<S: StateCell<Word = u64>> Drop for Acquire<'_, S> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.gate.leave(id);
        }
    }
}

/// Parks the thread until a permit is admitted.
pub(crate) fn block<S: StateCell<Word = u64>>(gate: &Gate<S>) -> Granted {
    let Ok(granted) = park_until(gate, |_| {
        park::park();
        Ok::<(), Infallible>(())
    });
    granted
}

/// Parks the thread until a permit is admitted, or until `timeout` has
/// passed; then `None`, having left the queue. A zero timeout only tries.
pub(crate) fn block_timeout<S: StateCell<Word = u64>>(
    gate: &Gate<S>,
    timeout: Duration,
) -> Option<Granted> {
    if timeout.is_zero() {
        return gate.try_acquire();
    }
    // A timeout past what `Instant` can hold never ends.
    let Some(deadline) = Instant::now().checked_add(timeout) else {
        return Some(block(gate));
    };
    park_until(gate, |queued| {
        let now = Instant::now();
        if now >= deadline {
            gate.leave(queued);
            return Err(());
        }
        park::park_timeout(deadline - now);
        Ok(())
    })
    .ok()
}

/// The blocking wait: steps of the queue protocol until one admits, with
/// `park` between them (an unpark, a timeout or a spurious return: the next
/// step tells). `park` gives up by returning an error, having left the
/// queue under the id it was given.
fn park_until<S: StateCell<Word = u64>, E>(
    gate: &Gate<S>,
    mut park: impl FnMut(u64) -> Result<(), E>,
) -> Result<Granted, E> {
    if let Some(granted) = gate.try_acquire() {
        return Ok(granted);
    }
    let mut id = None;
    loop {
        let queued = match gate.wait_step(id, None) {
            Step::Acquired(granted) => return Ok(granted),
            Step::Asleep(queued) => queued,
        };
        id = Some(queued);
        park(queued)?;
    }
}
