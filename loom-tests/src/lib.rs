//! The machinery shared by tollgate's loom models (`tests/*.rs` of this crate).
//!
//! Everything here exists only when the crate is built with
//! `RUSTFLAGS="--cfg loom"`; without it the crate is empty. `docs/verification.md`
//! describes the models and what each one explores.
//!
//! A model records every request each thread makes as an [`Op`]: how many permits,
//! the result, and the *exact* time the limiter decided at. The time comes from
//! [`RecordingClock`], a [`ManualClock`](tollgate::ManualClock) wrapper that leaves
//! each reading in a loom thread-local: a limiter reads its clock exactly once per
//! request (and [`record`] asserts that it does), so the reading left behind is the
//! request's decision time. After joining its threads a model checks
//!
//! - the limiter's invariant on the admissions ([`assert_bucket_bound`],
//!   [`assert_window_bound`]);
//! - that the threads' histories are linearizable with respect to the sequential
//!   algorithm ([`assert_linearizable`] with [`GcraSpec`] or [`WindowSpec`]): some
//!   order of all the requests, consistent with each thread's program order,
//!   makes the sequential machine return exactly the recorded results, exact
//!   retry-afters included, so no denial is spurious;
//! - that, once the threads are done, the limiter is neither stuck nor loose
//!   ([`single_threaded_tail`]).

// The links above name items that exist only under loom: a build without
// it documents an empty crate.
#![cfg_attr(not(loom), allow(rustdoc::broken_intra_doc_links))]

#[cfg(loom)]
pub use models::*;

#[cfg(all(loom, target_os = "linux"))]
mod stacks;
#[cfg(all(loom, target_os = "linux"))]
pub use stacks::reused_stacks;

#[cfg(loom)]
mod models {
    use std::cell::Cell;
    use std::collections::{BTreeMap, HashSet};
    use std::fmt::Debug;
    use std::future::Future;
    use std::hash::Hash;
    use std::pin::pin;
    use std::sync::Arc as StdArc;
    use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};
    use std::task::{Context, Poll, Waker};
    use std::time::{Duration, Instant};

    use loom::sync::Arc;
    use loom::thread::{self, JoinHandle};
    use tollgate::{Clock, ConfigError, Denied, ManualClock, RateLimiter};

    loom::thread_local! {
        /// Clock readings taken by this loom thread since the last [`record`], and
        /// the last of them. Thread-local, so concurrent requests cannot mix up
        /// each other's decision times.
        static READINGS: Cell<(u32, u64)> = Cell::new((0, 0));
    }

    /// A [`ManualClock`] that leaves every reading it returns in a thread-local,
    /// where [`record`] picks it up as the decision time of the request.
    ///
    /// Create it inside the model closure: the `ManualClock`'s atomic is loom's,
    /// and loom objects belong to one execution.
    #[derive(Debug, Clone)]
    pub struct RecordingClock(ManualClock);

    impl RecordingClock {
        /// Reads `clock`, which the model keeps a clone of to move time.
        pub fn new(clock: ManualClock) -> Self {
            RecordingClock(clock)
        }
    }

    impl Clock for RecordingClock {
        fn now(&self) -> u64 {
            let now = self.0.now();
            READINGS.with(|r| r.set((r.get().0 + 1, now)));
            now
        }
    }

    /// The stripes of a known-bad leased limiter: two bare permit counts with
    /// no time bound, so a permit leased at one reading is spent at any later
    /// one. The leased token bucket's and leased fixed window's known-bad
    /// models keep their spares here; the models must catch both.
    #[derive(Debug)]
    pub struct UntimedStripes([loom::sync::atomic::AtomicU64; 2]);

    impl Default for UntimedStripes {
        fn default() -> Self {
            UntimedStripes([
                loom::sync::atomic::AtomicU64::new(0),
                loom::sync::atomic::AtomicU64::new(0),
            ])
        }
    }

    impl UntimedStripes {
        /// The calling thread's stripe: spawned threads 1 and 2 get stripes 1
        /// and 0.
        fn mine(&self) -> &loom::sync::atomic::AtomicU64 {
            let id = format!("{:?}", loom::thread::current().id());
            &self.0[usize::from(id.ends_with('1'))]
        }

        /// Takes `n` permits from the caller's stripe if it holds that many,
        /// whenever they were leased.
        pub fn spend(&self, n: u64) -> bool {
            let stripe = self.mine();
            let mut left = stripe.load(loom::sync::atomic::Ordering::SeqCst);
            while left >= n {
                match stripe.compare_exchange(
                    left,
                    left - n,
                    loom::sync::atomic::Ordering::SeqCst,
                    loom::sync::atomic::Ordering::SeqCst,
                ) {
                    Ok(_) => return true,
                    Err(actual) => left = actual,
                }
            }
            false
        }

        /// Puts `spare` leased permits on the caller's stripe.
        pub fn keep(&self, spare: u64) {
            self.mine()
                .fetch_add(spare, loom::sync::atomic::Ordering::SeqCst);
        }
    }

    /// What the model threads ask a limiter for `n` permits through: every
    /// [`RateLimiter`]'s `try_acquire_n`, and a known-bad model's racy
    /// stand-in for one.
    pub trait Ask {
        /// Asks for `n` permits.
        fn ask(&self, n: u32) -> Result<(), Denied>;
    }

    impl<L: RateLimiter> Ask for L {
        fn ask(&self, n: u32) -> Result<(), Denied> {
            self.try_acquire_n(n)
        }
    }

    /// One request as a model saw it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Op {
        /// Permits asked for.
        pub n: u32,
        /// The decision time: the one clock reading the request took, or `None`
        /// when it was rejected for its size without reading the clock.
        pub at: Option<u64>,
        /// What the limiter answered.
        pub result: Result<(), Denied>,
    }

    /// Every admission of `threads` as `(decision time, permits)`, in time
    /// order: what a bound is checked on.
    pub fn admissions_in_order(threads: &[Vec<Op>]) -> Vec<(u64, u32)> {
        let mut admitted: Vec<(u64, u32)> = admissions(threads).collect();
        admitted.sort_unstable();
        admitted
    }

    /// Runs one request for `n` permits (`acquire` must ask for exactly `n`) and
    /// records it with its decision time.
    ///
    /// Panics if a decision did not read the clock exactly once (the decision time
    /// would be ambiguous), if a size rejection read it at all, or if a
    /// retry-after is zero (a denial must name a wait that can help).
    pub fn record(n: u32, acquire: impl FnOnce() -> Result<(), Denied>) -> Op {
        READINGS.with(|r| r.set((0, 0)));
        let result = acquire();
        let (reads, at) = READINGS.with(Cell::get);
        match result {
            Ok(()) | Err(Denied::RetryAfter(_)) => assert_eq!(
                reads, 1,
                "a decision for {n} permits read the clock {reads} times, not once"
            ),
            Err(_) => assert_eq!(
                reads, 0,
                "rejecting {n} permits for their size read the clock"
            ),
        }
        if let Err(Denied::RetryAfter(wait)) = result {
            assert!(
                !wait.is_zero(),
                "a denial of {n} permits said to retry after 0 ns"
            );
        }
        Op {
            n,
            at: (reads == 1).then_some(at),
            result,
        }
    }

    /// Explores `model` under loom with the given preemption bound, prints how many
    /// interleavings it ran and how long that took (or in which interleaving it
    /// failed), and returns the count.
    ///
    /// The count is kept in a `std` atomic, outside loom's view, so counting does
    /// not add interleavings.
    pub fn explore(
        name: &str,
        preemption_bound: usize,
        model: impl Fn() + Sync + Send + 'static,
    ) -> usize {
        let report = Report {
            name,
            preemption_bound,
            iterations: StdArc::new(AtomicUsize::new(0)),
            start: Instant::now(),
        };
        let counter = StdArc::clone(&report.iterations);
        #[cfg(target_os = "linux")]
        crate::stacks::keep_stacks();
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(preemption_bound);
        // loom's default of 1,000 scheduling points per execution is a spin
        // detector; models that replay sequential histories inside the
        // execution (`reconfigure.rs`'s linearizability checks: each replay
        // builds a limiter and runs every operation, each atomic access a
        // point) pass it without spinning. A real spin still fails, later.
        builder.max_branches = 20_000;
        builder.check(move || {
            counter.fetch_add(1, StdOrdering::Relaxed);
            model();
        });
        report.iterations.load(StdOrdering::Relaxed)
    }

    /// A preemption bound for a model whose next bound up costs minutes:
    /// `bound` in the default suite (`scripts/loom-run`), `deep` in the
    /// opt-in deeper run (`scripts/loom-run --deep`, which sets
    /// `TOLLGATE_LOOM_DEEP=1`).
    ///
    /// Only a model whose default bound still catches every mutant and
    /// known-bad it caught at `deep` is given one (`scripts/mutate-loom`
    /// measures that).
    pub fn depth(bound: usize, deep: usize) -> usize {
        if std::env::var_os("TOLLGATE_LOOM_DEEP").is_some_and(|v| v != "0") {
            deep
        } else {
            bound
        }
    }

    /// [`explore`], and asserts that the model raced: a model that ran in a
    /// single interleaving explored nothing.
    pub fn explore_races(
        name: &str,
        preemption_bound: usize,
        model: impl Fn() + Sync + Send + 'static,
    ) {
        let explored = explore(name, preemption_bound, model);
        assert!(explored > 1);
    }

    /// `ns` nanoseconds: the models' clocks move by a few at a time.
    pub fn nanos(ns: u64) -> Duration {
        Duration::from_nanos(ns)
    }

    /// A limiter that `build` makes on a [`RecordingClock`] of a fresh
    /// manual clock at 0, and a handle to move that clock.
    ///
    /// Panics if `build` refuses its configuration.
    pub fn on_manual_clock<L>(
        build: impl FnOnce(RecordingClock) -> Result<L, ConfigError>,
    ) -> (Arc<L>, ManualClock) {
        with_manual_clock(|clock| build(clock).expect("a valid configuration"))
    }

    /// As [`on_manual_clock`], for a limiter that has no configuration to
    /// refuse (a known-bad model's).
    pub fn with_manual_clock<L>(build: impl FnOnce(RecordingClock) -> L) -> (Arc<L>, ManualClock) {
        let clock = ManualClock::new();
        let limiter = build(RecordingClock::new(clock.clone()));
        (Arc::new(limiter), clock)
    }

    /// A limiter the shared model shapes run on: how a model makes a fresh one
    /// of a given capacity (burst or limit) on a manual clock at 0, and every
    /// check it makes once its threads are joined.
    pub struct Subject<L> {
        /// A fresh limiter of the capacity, and a handle to move its clock.
        pub build: fn(u32) -> (Arc<L>, ManualClock),
        /// The checks on the joined threads' requests, given the clock and
        /// the capacity.
        pub verify: fn(&L, &ManualClock, u32, Vec<Vec<Op>>),
    }

    impl<L: RateLimiter + Send + Sync + 'static> Subject<L> {
        /// [`explore_races`] with a fresh limiter of `capacity` in every
        /// interleaving: `model` races its threads on it and returns their
        /// requests, which the subject's checks then judge.
        pub fn explore(
            &self,
            name: &str,
            preemption_bound: usize,
            capacity: u32,
            model: impl Fn(&Arc<L>, &ManualClock) -> Vec<Vec<Op>> + Sync + Send + 'static,
        ) {
            let (build, verify) = (self.build, self.verify);
            explore_limiter(
                name,
                preemption_bound,
                move || build(capacity),
                model,
                move |limiter, clock, threads| verify(limiter, clock, capacity, threads),
            );
        }
    }

    /// [`explore_races`] with a fresh limiter from `build` in every
    /// interleaving: `model` races its threads on it and returns their
    /// requests, which `verify` then judges.
    pub fn explore_limiter<L>(
        name: &str,
        preemption_bound: usize,
        build: impl Fn() -> (Arc<L>, ManualClock) + Sync + Send + 'static,
        model: impl Fn(&Arc<L>, &ManualClock) -> Vec<Vec<Op>> + Sync + Send + 'static,
        verify: impl Fn(&L, &ManualClock, Vec<Vec<Op>>) + Sync + Send + 'static,
    ) {
        explore_races(name, preemption_bound, move || {
            let (limiter, clock) = build();
            let threads = model(&limiter, &clock);
            verify(&limiter, &clock, threads);
        });
    }

    /// Requests that can never be admitted (none, one more than `capacity`,
    /// `u32::MAX`), made while other threads race: they must be rejected as
    /// such, without reading the clock or touching the state.
    pub fn invalid_requests(limiter: &impl RateLimiter, capacity: u32) -> Vec<Op> {
        let ops = [0, capacity + 1, u32::MAX].map(|n| record(n, || limiter.try_acquire_n(n)));
        assert_eq!(ops[0].result, Err(Denied::ZeroPermits));
        for op in &ops[1..] {
            assert_eq!(
                op.result,
                Err(Denied::ExceedsCapacity {
                    requested: op.n,
                    capacity
                })
            );
        }
        ops.to_vec()
    }

    /// Two threads race single permits across a move of the clock: one asks,
    /// moves the clock on by `step` ns and asks again; the other asks twice,
    /// then makes [`invalid_requests`].
    pub fn advance_between_acquires<L: RateLimiter + Send + Sync + 'static>(
        limiter: &Arc<L>,
        clock: &ManualClock,
        capacity: u32,
        step: u64,
    ) -> Vec<Vec<Op>> {
        let advancer = advancer(limiter, clock, &[1], step, &[1]);
        let racer = racer_with_invalid_requests(limiter, capacity);
        join_all(vec![advancer, racer])
    }

    /// Spawns a thread that asks `limiter` for one permit twice, then makes
    /// [`invalid_requests`].
    pub fn racer_with_invalid_requests<L: RateLimiter + Send + Sync + 'static>(
        limiter: &Arc<L>,
        capacity: u32,
    ) -> JoinHandle<Vec<Op>> {
        let l = limiter.clone();
        thread::spawn(move || {
            let mut ops = vec![record(1, || l.try_acquire()), record(1, || l.try_acquire())];
            ops.extend(invalid_requests(&*l, capacity));
            ops
        })
    }

    /// A thread for each of `requests` (its permits, request by request),
    /// racing a last thread that moves the clock on by `step` ns and then
    /// makes the `late` requests.
    pub fn race_an_advance<L: RateLimiter + Send + Sync + 'static>(
        limiter: &Arc<L>,
        clock: &ManualClock,
        requests: &[&[u32]],
        step: u64,
        late: &[u32],
    ) -> Vec<Vec<Op>> {
        let mut handles: Vec<_> = requests.iter().map(|r| requester(limiter, r)).collect();
        handles.push(advancer(limiter, clock, &[], step, late));
        join_all(handles)
    }

    /// A move of a model's clock.
    #[derive(Debug, Clone, Copy)]
    pub enum Move {
        /// On by this many nanoseconds ([`ManualClock::advance`]).
        By(u64),
        /// To this reading in nanoseconds, backwards as well as forwards
        /// ([`ManualClock::set`]).
        To(u64),
    }

    /// A thread for each of `requests`, racing a thread that makes each of
    /// `moves` of the clock in turn.
    pub fn race_a_moving_clock<L: RateLimiter + Send + Sync + 'static>(
        limiter: &Arc<L>,
        clock: &ManualClock,
        requests: &[&[u32]],
        moves: &[Move],
    ) -> Vec<Vec<Op>> {
        let handles: Vec<_> = requests.iter().map(|r| requester(limiter, r)).collect();
        let mover = clock_mover(clock, moves);
        let threads = join_all(handles);
        mover.join().unwrap();
        threads
    }

    /// Spawns a thread that asks `limiter` for each of `requests` permits in
    /// turn and returns the recorded requests.
    pub fn requester<L: Ask + Send + Sync + 'static>(
        limiter: &Arc<L>,
        requests: &[u32],
    ) -> JoinHandle<Vec<Op>> {
        let (l, requests) = (limiter.clone(), requests.to_vec());
        thread::spawn(move || requests.iter().map(|&n| record(n, || l.ask(n))).collect())
    }

    /// Spawns a thread that asks `limiter` for each of `before` permits in
    /// turn, moves `clock` on by `by` ns, then asks for each of `after`.
    pub fn advancer<L: Ask + Send + Sync + 'static>(
        limiter: &Arc<L>,
        clock: &ManualClock,
        before: &[u32],
        by: u64,
        after: &[u32],
    ) -> JoinHandle<Vec<Op>> {
        let (l, c) = (limiter.clone(), clock.clone());
        let (before, after) = (before.to_vec(), after.to_vec());
        thread::spawn(move || {
            let mut ops: Vec<Op> = before.iter().map(|&n| record(n, || l.ask(n))).collect();
            c.advance(nanos(by));
            ops.extend(after.iter().map(|&n| record(n, || l.ask(n))));
            ops
        })
    }

    /// One step of a [`scripted`] thread.
    #[derive(Debug, Clone, Copy)]
    pub enum Step {
        /// Ask for this many permits, and record the request.
        Take(u32),
        /// Move the clock on by this many nanoseconds ([`ManualClock::advance`]).
        By(u64),
        /// Set the clock to this reading in nanoseconds ([`ManualClock::set`]).
        To(u64),
    }

    /// Spawns a thread that takes each of `steps` in turn, asking `limiter`
    /// for permits and moving `clock` between requests, and returns the
    /// recorded requests.
    pub fn scripted<L: Ask + Send + Sync + 'static>(
        limiter: &Arc<L>,
        clock: &ManualClock,
        steps: &[Step],
    ) -> JoinHandle<Vec<Op>> {
        let (l, c, steps) = (limiter.clone(), clock.clone(), steps.to_vec());
        thread::spawn(move || {
            let mut ops = Vec::new();
            for &step in &steps {
                match step {
                    Step::Take(n) => ops.push(record(n, || l.ask(n))),
                    Step::By(ns) => c.advance(nanos(ns)),
                    Step::To(reading) => c.set(reading),
                }
            }
            ops
        })
    }

    /// A thread for each of `scripts`, spawned in order and joined in order:
    /// each thread's recorded requests. A script that never moves the clock
    /// runs on a [`requester`], which holds no handle to it.
    pub fn race<L: Ask + Send + Sync + 'static>(
        limiter: &Arc<L>,
        clock: &ManualClock,
        scripts: &[&[Step]],
    ) -> Vec<Vec<Op>> {
        join_all(spawn_scripts(limiter, clock, scripts))
    }

    /// The threads of [`race`], spawned in order and not yet joined.
    fn spawn_scripts<L: Ask + Send + Sync + 'static>(
        limiter: &Arc<L>,
        clock: &ManualClock,
        scripts: &[&[Step]],
    ) -> Vec<JoinHandle<Vec<Op>>> {
        scripts
            .iter()
            .map(|steps| {
                let takes: Option<Vec<u32>> = steps
                    .iter()
                    .map(|step| match step {
                        Step::Take(n) => Some(*n),
                        Step::By(_) | Step::To(_) => None,
                    })
                    .collect();
                match takes {
                    Some(requests) => requester(limiter, &requests),
                    None => scripted(limiter, clock, steps),
                }
            })
            .collect()
    }

    /// The calling thread asks `limiter` for each of `first` permits in turn,
    /// then a thread for each of `scripts` races as in [`race`]; the calling
    /// thread's requests come first.
    pub fn race_after<L: Ask + Send + Sync + 'static>(
        limiter: &Arc<L>,
        clock: &ManualClock,
        first: &[u32],
        scripts: &[&[Step]],
    ) -> Vec<Vec<Op>> {
        let mut threads = vec![
            first
                .iter()
                .map(|&n| record(n, || limiter.ask(n)))
                .collect(),
        ];
        threads.extend(race(limiter, clock, scripts));
        threads
    }

    /// As [`race`], with `mine` run on the calling thread once every thread
    /// is spawned and before any is joined; its requests come last.
    pub fn race_beside<L: Ask + Send + Sync + 'static>(
        limiter: &Arc<L>,
        clock: &ManualClock,
        scripts: &[&[Step]],
        mine: impl FnOnce() -> Vec<Op>,
    ) -> Vec<Vec<Op>> {
        let handles = spawn_scripts(limiter, clock, scripts);
        let mine = mine();
        let mut threads = join_all(handles);
        threads.push(mine);
        threads
    }

    /// Spawns a thread that makes each of `moves` of `clock` in turn.
    pub fn clock_mover(clock: &ManualClock, moves: &[Move]) -> JoinHandle<()> {
        let (c, moves) = (clock.clone(), moves.to_vec());
        thread::spawn(move || {
            for &one in &moves {
                match one {
                    Move::By(ns) => c.advance(nanos(ns)),
                    Move::To(reading) => c.set(reading),
                }
            }
        })
    }

    /// Wakes a loom thread parked in [`block_on`].
    struct Unpark(thread::Thread);

    impl std::task::Wake for Unpark {
        fn wake(self: StdArc<Self>) {
            self.0.unpark();
        }
    }

    /// Polls `future` on this loom thread until it is ready, parking between
    /// polls (loom's own `block_on` needs a feature the loom crate is not
    /// built with here). A wake-up that never comes leaves the thread parked:
    /// a deadlock loom reports.
    pub fn block_on<F: Future>(future: F) -> F::Output {
        let waker = Waker::from(StdArc::new(Unpark(thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut future = pin!(future);
        loop {
            if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
                return output;
            }
            thread::park();
        }
    }

    /// Joins `handles` in order: each thread's recorded requests.
    pub fn join_all(handles: Vec<JoinHandle<Vec<Op>>>) -> Vec<Vec<Op>> {
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    /// Prints a model's statistics when it finishes, and also when it unwinds
    /// from a failed check, so a failure says how deep into the search it was.
    struct Report<'a> {
        name: &'a str,
        preemption_bound: usize,
        iterations: StdArc<AtomicUsize>,
        start: Instant,
    }

    impl Drop for Report<'_> {
        fn drop(&mut self) {
            let (name, bound) = (self.name, self.preemption_bound);
            let count = self.iterations.load(StdOrdering::Relaxed);
            let secs = self.start.elapsed().as_secs_f64();
            if std::thread::panicking() {
                eprintln!(
                    "loom model {name}: failed in interleaving {count} after {secs:.2} s (preemption bound {bound})"
                );
            } else {
                eprintln!(
                    "loom model {name}: {count} interleavings in {secs:.2} s (preemption bound {bound})"
                );
            }
        }
    }

    /// The sequential algorithm a limiter must be linearizable to.
    pub trait Spec {
        /// The algorithm's state.
        type State: Copy + Eq + Hash + Debug;
        /// The state of a fresh limiter.
        fn initial(&self) -> Self::State;
        /// The most permits one request may ask for.
        fn capacity(&self) -> u32;
        /// The state after admitting `1 <= n <= capacity` permits at `now`, or the
        /// denial.
        fn decide(&self, state: Self::State, now: u64, n: u32) -> Result<Self::State, Denied>;
    }

    /// The token bucket as GCRA: the state is the theoretical arrival time (TAT);
    /// `n` permits at `now` are admitted iff `max(TAT, now) + n·interval <=
    /// now + capacity·interval`, and a denial waits out the difference.
    #[derive(Debug, Clone, Copy)]
    pub struct GcraSpec {
        /// Burst capacity.
        pub capacity: u32,
        /// Nanoseconds per permit.
        pub interval: u64,
    }

    impl Spec for GcraSpec {
        type State = u64;

        fn initial(&self) -> u64 {
            0
        }

        fn capacity(&self) -> u32 {
            self.capacity
        }

        fn decide(&self, tat: u64, now: u64, n: u32) -> Result<u64, Denied> {
            let next = tat.max(now) + u64::from(n) * self.interval;
            let limit = now + u64::from(self.capacity) * self.interval;
            if next <= limit {
                Ok(next)
            } else {
                Err(Denied::RetryAfter(Duration::from_nanos(next - limit)))
            }
        }
    }

    /// The fixed window: the state is the window last counted in and its count. A
    /// request counts in the later of its own window and the stored one (a stale
    /// or backwards reading never reopens a closed window), and a denial waits
    /// until that window ends.
    #[derive(Debug, Clone, Copy)]
    pub struct WindowSpec {
        /// Permits per window.
        pub limit: u32,
        /// The window's length in nanoseconds.
        pub window: u64,
    }

    impl Spec for WindowSpec {
        type State = (u64, u32);

        fn initial(&self) -> (u64, u32) {
            (0, 0)
        }

        fn capacity(&self) -> u32 {
            self.limit
        }

        fn decide(
            &self,
            (index, count): (u64, u32),
            now: u64,
            n: u32,
        ) -> Result<(u64, u32), Denied> {
            let (index, count) = if now / self.window > index {
                (now / self.window, 0)
            } else {
                (index, count)
            };
            if count + n <= self.limit {
                Ok((index, count + n))
            } else {
                Err(Denied::RetryAfter(Duration::from_nanos(
                    (index + 1) * self.window - now,
                )))
            }
        }
    }

    /// What the sequential algorithm answers to `op` in `state`, or `None` if `op`
    /// lacks the decision time the answer needs.
    fn expected<S: Spec>(spec: &S, state: S::State, op: &Op) -> Option<Result<S::State, Denied>> {
        if op.n == 0 {
            Some(Err(Denied::ZeroPermits))
        } else if op.n > spec.capacity() {
            Some(Err(Denied::ExceedsCapacity {
                requested: op.n,
                capacity: spec.capacity(),
            }))
        } else {
            op.at.map(|now| spec.decide(state, now, op.n))
        }
    }

    /// A total order of the ops in `threads` (as `(thread, index)` pairs) that
    /// keeps each thread's program order and in which the sequential algorithm
    /// gives every op its recorded result; `None` if there is none.
    ///
    /// A depth-first search over the merges of the threads' histories, pruning
    /// every op whose recorded result the algorithm would not give and
    /// remembering dead ends. Real-time order across threads is not required, so
    /// the check can only be more permissive than linearizability, never stricter:
    /// a failure is a real violation.
    pub fn linearize<S: Spec>(spec: &S, threads: &[Vec<Op>]) -> Option<Vec<(usize, usize)>> {
        linearize_ordered(spec, threads, None)
    }

    /// As [`linearize`], with `tail` (a history recorded on the model's own
    /// thread after every other thread was joined) placed after all of
    /// `threads`' ops: the order the join imposes. Appending the tail as one
    /// more thread instead would let the search place tail ops before the
    /// threads' and accept histories no real order produces.
    pub fn linearize_then<S: Spec>(
        spec: &S,
        threads: &[Vec<Op>],
        tail: &[Op],
    ) -> Option<Vec<(usize, usize)>> {
        let mut all = threads.to_vec();
        all.push(tail.to_vec());
        linearize_ordered(spec, &all, Some(threads.len()))
    }

    /// The search behind [`linearize`] and [`linearize_then`]: thread `last`,
    /// if any, may take a step only once every other thread has finished.
    fn linearize_ordered<S: Spec>(
        spec: &S,
        threads: &[Vec<Op>],
        last: Option<usize>,
    ) -> Option<Vec<(usize, usize)>> {
        fn search<S: Spec>(
            spec: &S,
            threads: &[Vec<Op>],
            last: Option<usize>,
            next: &mut Vec<usize>,
            state: S::State,
            order: &mut Vec<(usize, usize)>,
            dead: &mut HashSet<(Vec<usize>, S::State)>,
        ) -> bool {
            if next.iter().zip(threads).all(|(&i, ops)| i == ops.len()) {
                return true;
            }
            if dead.contains(&(next.clone(), state)) {
                return false;
            }
            // Whether every thread but `last` has finished: only then may
            // `last` move.
            let others_done = last.is_none_or(|l| {
                next.iter()
                    .zip(threads)
                    .enumerate()
                    .all(|(u, (&i, ops))| u == l || i == ops.len())
            });
            for t in 0..threads.len() {
                if last == Some(t) && !others_done {
                    continue;
                }
                let Some(op) = threads[t].get(next[t]) else {
                    continue;
                };
                let after = match (expected(spec, state, op), op.result) {
                    (Some(Ok(after)), Ok(())) => after,
                    (Some(Err(want)), Err(got)) if want == got => state,
                    _ => continue,
                };
                order.push((t, next[t]));
                next[t] += 1;
                if search(spec, threads, last, next, after, order, dead) {
                    return true;
                }
                next[t] -= 1;
                order.pop();
            }
            dead.insert((next.clone(), state));
            false
        }

        let mut next = vec![0; threads.len()];
        let mut order = Vec::new();
        let mut dead = HashSet::new();
        search(
            spec,
            threads,
            last,
            &mut next,
            spec.initial(),
            &mut order,
            &mut dead,
        )
        .then_some(order)
    }

    /// Panics unless the histories are linearizable with respect to `spec`
    /// (see [`linearize`]).
    pub fn assert_linearizable<S: Spec + Debug>(spec: &S, threads: &[Vec<Op>]) {
        assert!(
            linearize(spec, threads).is_some(),
            "not linearizable: no order of the requests, consistent with each thread's \
             program order, makes {spec:?} give the recorded results; histories: {threads:#?}"
        );
    }

    /// The token bucket's invariant, on exact decision times: for every pair of
    /// admission times `a <= b`, the permits admitted at times in `[a, b]` number
    /// at most `capacity + (b − a) / interval`, in integers:
    /// `(count − capacity) · interval <= b − a`.
    ///
    /// Holds for any readings, stale or backwards: every admission at `t` moves
    /// the TAT by its own `n · interval` from at least `t`, and never past
    /// `t + capacity · interval`.
    pub fn assert_bucket_bound(capacity: u32, interval: u64, threads: &[Vec<Op>]) {
        let admitted: Vec<(u64, u32)> = admissions(threads).collect();
        for &(a, _) in &admitted {
            for &(b, _) in &admitted {
                if a > b {
                    continue;
                }
                let count: u64 = admitted
                    .iter()
                    .filter(|&&(t, _)| a <= t && t <= b)
                    .map(|&(_, n)| u64::from(n))
                    .sum();
                let excess = count.saturating_sub(u64::from(capacity));
                assert!(
                    excess * interval <= b - a,
                    "token bucket invariant violated: {count} permits admitted at times in \
                     [{a}, {b}] ns, more than {capacity} + ({b} - {a}) / {interval}; \
                     histories: {threads:#?}"
                );
            }
        }
    }

    /// The fixed window's invariant, on exact decision windows: at most `limit`
    /// permits count in any window.
    ///
    /// An admission counts in the later of its reading's window and the window
    /// already stored, i.e. in the running maximum of the admissions' windows in
    /// the order their compare-and-swaps took effect. That order is not
    /// observable, so the check is that *some* order consistent with every
    /// thread's program order keeps every window at or under the limit. With
    /// readings that are never stale this is exactly "permits with
    /// `time / window == k` are at most `limit` for every `k`".
    pub fn assert_window_bound(limit: u32, window: u64, threads: &[Vec<Op>]) {
        let admitted: Vec<Vec<Op>> = threads
            .iter()
            .map(|ops| ops.iter().filter(|op| op.result.is_ok()).copied().collect())
            .collect();
        assert!(
            linearize(&WindowSpec { limit, window }, &admitted).is_some(),
            "fixed window invariant violated: every order of the admissions consistent with \
             each thread's program order puts more than {limit} permits in some \
             {window} ns window; histories: {threads:#?}"
        );
    }

    /// As [`assert_window_bound`], with `tail` — the requests made on the
    /// model's own thread after joining the others (`single_threaded_tail`) —
    /// ordered after every thread's admissions, as the join orders them.
    pub fn assert_window_bound_then(limit: u32, window: u64, threads: &[Vec<Op>], tail: &[Op]) {
        let admitted = |ops: &[Op]| -> Vec<Op> {
            ops.iter().filter(|op| op.result.is_ok()).copied().collect()
        };
        let threads_admitted: Vec<Vec<Op>> = threads.iter().map(|ops| admitted(ops)).collect();
        assert!(
            linearize_then(
                &WindowSpec { limit, window },
                &threads_admitted,
                &admitted(tail)
            )
            .is_some(),
            "fixed window invariant violated: every order of the admissions consistent with \
             each thread's program order, the tail after them all, puts more than {limit} \
             permits in some {window} ns window; histories: {threads:#?}; tail: {tail:#?}"
        );
    }

    /// The sliding window's invariant on exact decision times: the permits
    /// admitted at times in any `subs` consecutive sub-windows of `sub` ns
    /// are at most `limit`. A violation names the window `what`.
    pub fn assert_sliding_bound(what: &str, sub: u64, limit: u32, subs: u32, threads: &[Vec<Op>]) {
        let mut per_sub = BTreeMap::<u64, u64>::new();
        for (at, n) in admissions(threads) {
            *per_sub.entry(at / sub).or_default() += u64::from(n);
        }
        for &q in per_sub.keys() {
            let first = (q + 1).saturating_sub(u64::from(subs));
            let sum: u64 = per_sub.range(first..=q).map(|(_, n)| n).sum();
            assert!(
                sum <= u64::from(limit),
                "{what} invariant violated: {sum} permits admitted in sub-windows \
                 {first}..={q} ({subs} sub-windows of {sub} ns, limit {limit}); histories: {threads:#?}"
            );
        }
    }

    /// Panics unless every request of `threads` was admitted: where demand
    /// fits, any denial is spurious.
    pub fn assert_all_admitted(threads: &[Vec<Op>]) {
        for op in threads.iter().flatten() {
            assert_eq!(op.result, Ok(()), "spurious denial: {threads:#?}");
        }
    }

    /// Every admission of `threads` as `(decision time, permits)`.
    pub fn admissions(threads: &[Vec<Op>]) -> impl Iterator<Item = (u64, u32)> + '_ {
        threads
            .iter()
            .flatten()
            .filter_map(|op| match (op.result, op.at) {
                (Ok(()), Some(at)) => Some((at, op.n)),
                (Ok(()), None) => panic!("{op:?} was admitted without reading the clock"),
                _ => None,
            })
    }

    /// After the model's threads are joined, on the model's own thread: with the
    /// clock standing still, single permits are admitted until one is denied (at
    /// most `capacity` of them, or the limiter is loose); then the denial's
    /// retry-after is exact to the nanosecond: one nanosecond short of it the
    /// request is denied with a 1 ns retry-after, and at it the request is
    /// admitted (the limiter is not stuck, even after a clock that stepped back).
    /// Returns the requests made, for the invariant checks.
    pub fn single_threaded_tail(
        clock: &ManualClock,
        capacity: u32,
        acquire: impl Fn() -> Result<(), Denied>,
    ) -> Vec<Op> {
        let mut ops = Vec::new();
        let wait = loop {
            let op = record(1, &acquire);
            ops.push(op);
            match op.result {
                Ok(()) => assert!(
                    ops.len() <= capacity as usize,
                    "{} single permits admitted with the clock standing still; capacity {capacity}",
                    ops.len()
                ),
                Err(Denied::RetryAfter(wait)) => break wait,
                Err(other) => panic!("a single permit was denied with {other:?}"),
            }
        };
        let one = Duration::from_nanos(1);
        if wait > one {
            clock.advance(wait - one);
            let op = record(1, &acquire);
            assert_eq!(
                op.result,
                Err(Denied::RetryAfter(one)),
                "1 ns before a retry-after of {wait:?} ran out"
            );
            ops.push(op);
        }
        clock.advance(one);
        let op = record(1, &acquire);
        assert_eq!(op.result, Ok(()), "when a retry-after of {wait:?} ran out");
        ops.push(op);
        ops
    }

    /// Every check a GCRA-bucket model (token bucket, leaky bucket meter) makes
    /// once its threads are joined: the bucket bound on every pair of admission
    /// times, linearizability against sequential GCRA (exact retry-afters
    /// included), then the single-threaded tail and the bound again.
    pub fn verify_gcra(
        limiter: &impl RateLimiter,
        clock: &ManualClock,
        capacity: u32,
        interval: u64,
        mut threads: Vec<Vec<Op>>,
    ) {
        assert_bucket_bound(capacity, interval, &threads);
        assert_linearizable(&GcraSpec { capacity, interval }, &threads);
        threads.push(single_threaded_tail(clock, capacity, || {
            limiter.try_acquire()
        }));
        assert_bucket_bound(capacity, interval, &threads);
    }
}
