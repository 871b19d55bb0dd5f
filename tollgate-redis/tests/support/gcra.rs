//! The GCRA invariant checker the lease tests share.

/// GCRA over `(time, permits)` records sorted by time: in any `[a, b]`, at
/// most `capacity + (b − a)/interval`.
pub fn gcra_violations(records: &[(u64, u64)], capacity: u64, interval: u64) -> usize {
    let mut violations = 0;
    let mut before = 0u64;
    let mut lowest: Option<i128> = None;
    for &(time, n) in records {
        let b = i128::from(before) * i128::from(interval) - i128::from(time);
        lowest = Some(lowest.map_or(b, |l| l.min(b)));
        before += n;
        let a = i128::from(before) * i128::from(interval) - i128::from(time);
        if a - lowest.unwrap() > i128::from(capacity) * i128::from(interval) {
            violations += 1;
        }
    }
    violations
}
