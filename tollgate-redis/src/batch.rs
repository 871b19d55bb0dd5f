//! Automatic batching: the decisions that queue on a client while its calls
//! are in flight go to the server together, as one call of the decision
//! script, which decides them in the order they queued.
//!
//! A request that finds a free call slot (`max_calls_in_flight`) goes alone,
//! at once. One that finds none queues; one task per client (clones share
//! it) takes the first queued request, waits for a free slot, then takes
//! whatever else has queued meanwhile, up to `max_batch` decisions, and sends
//! it: under load the requests that arrive during a round trip share the
//! next one. A request is one group of the script: all-or-nothing, its own
//! reply.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use redis::Value;
use redis::cluster_routing::Slot;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::error::Error;

/// One decision of a group: the Redis key and its six script arguments
/// (kind, n, three terms, whether it ends the group).
pub(crate) type Decision = (String, [u64; 6]);

/// A group of decisions waiting for its call, and where its replies go.
pub(crate) struct Job {
    pub(crate) decisions: Vec<Decision>,
    /// The replayed time of a test build; jobs at different times never
    /// share a call.
    pub(crate) now_us: Option<u64>,
    /// The Cluster slot of every key of the group; jobs of different slots
    /// never share a call.
    pub(crate) slot: Option<Slot>,
    pub(crate) reply: oneshot::Sender<Result<Vec<Value>, Error>>,
}

/// How much the batcher puts in one call, and how many calls it keeps in
/// flight.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max_batch: usize,
    pub(crate) max_calls_in_flight: usize,
}

/// What the batching task sends its calls through (the client, without a
/// batcher of its own): one call of the decision script for `decisions`,
/// one reply per decision.
pub(crate) trait Caller: Clone + Send + Sync + 'static {
    fn call<'a>(
        &'a self,
        decisions: &'a [&'a Decision],
        now_us: Option<u64>,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Value>, Error>> + Send + 'a>>;
}

/// A client's way to its batching task: the queue, and the call slots that
/// the task and the requests that go alone share.
#[derive(Clone)]
pub(crate) struct Batcher {
    pub(crate) queue: mpsc::UnboundedSender<Job>,
    /// One permit per call in flight. A request that finds one free goes
    /// alone at once, with no hop through the task; a request that finds
    /// none queues. The semaphore is fair: a free slot goes to the task
    /// when it waits for one, so queued requests are never overtaken for
    /// long.
    pub(crate) slots: Arc<Semaphore>,
}

/// Starts the batching task of `client` (whose own batcher must be unset:
/// the task calls the server directly).
pub(crate) fn start(client: impl Caller, limits: Limits) -> Batcher {
    let (queue, rx) = mpsc::unbounded_channel();
    let slots = Arc::new(Semaphore::new(limits.max_calls_in_flight.max(1)));
    tokio::spawn(run(client, limits, Arc::clone(&slots), rx));
    Batcher { queue, slots }
}

/// The batching loop: ends when every sender (every clone of the client)
/// is gone.
async fn run(
    client: impl Caller,
    limits: Limits,
    slots: Arc<Semaphore>,
    mut queue: mpsc::UnboundedReceiver<Job>,
) {
    // A job taken from the queue that did not fit the last batch.
    let mut held: Option<Job> = None;
    loop {
        let first = match held.take() {
            Some(job) => job,
            None => match queue.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        // Waiting here, not before `recv`, lets the requests that arrive
        // while every slot is busy pile up for the next call.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let mut size = first.decisions.len();
        let mut jobs = vec![first];
        while size < limits.max_batch {
            match queue.try_recv() {
                Ok(job) if size + job.decisions.len() <= limits.max_batch => {
                    size += job.decisions.len();
                    jobs.push(job);
                }
                Ok(job) => {
                    held = Some(job);
                    break;
                }
                Err(_) => break,
            }
        }
        // A caller that gave up (its deadline passed, its future dropped)
        // wants nothing sent any more.
        jobs.retain(|job| !job.reply.is_closed());
        let slot = Arc::new(slot);
        for (_, part) in partition(jobs) {
            let client = client.clone();
            let slot = Arc::clone(&slot);
            tokio::spawn(async move {
                send(&client, part).await;
                drop(slot);
            });
        }
    }
}

/// What one call cannot mix: a Cluster slot and a replayed time.
type Mix = (Option<Slot>, Option<u64>);

/// Splits the jobs of one batch by what one call cannot mix. Order is kept
/// within each part.
fn partition(jobs: Vec<Job>) -> Vec<(Mix, Vec<Job>)> {
    let mut parts: Vec<(Mix, Vec<Job>)> = Vec::new();
    let mut index: HashMap<Mix, usize> = HashMap::new();
    for job in jobs {
        let key = (job.slot, job.now_us);
        let at = *index.entry(key).or_insert_with(|| {
            parts.push((key, Vec::new()));
            parts.len() - 1
        });
        parts[at].1.push(job);
    }
    parts
}

/// One call for `jobs`, each answered with its own replies or the call's
/// error.
async fn send(client: &impl Caller, jobs: Vec<Job>) {
    if jobs.is_empty() {
        return;
    }
    let now_us = jobs[0].now_us;
    let groups = jobs.len();
    let decisions: Vec<&Decision> = jobs.iter().flat_map(|job| job.decisions.iter()).collect();
    let total: usize = jobs.iter().map(|job| job.decisions.len()).sum();
    crate::metrics::batch(groups, total);
    match client.call(&decisions, now_us).await {
        Ok(replies) if replies.len() == total => {
            let mut replies = replies.into_iter();
            for job in jobs {
                let mine = replies.by_ref().take(job.decisions.len()).collect();
                let _ = job.reply.send(Ok(mine));
            }
        }
        Ok(replies) => {
            let err = Error::UnexpectedReply(format!(
                "{} replies to a call of {total} decisions",
                replies.len()
            ));
            for job in jobs {
                let _ = job.reply.send(Err(err.clone()));
            }
        }
        Err(err) => {
            let err = err.for_batch_of(groups);
            for job in jobs {
                let _ = job.reply.send(Err(err.clone()));
            }
        }
    }
}
