//! `Limiter::report`: the quota an admission left, for `RateLimit` headers.
//! The time until full is never shorter than the script's own state says.

use std::time::Duration;

use tollgate::Rate;
use tollgate_redis::{
    Admission, ApproxSlidingWindow, FixedWindow, Limiter, SlidingLog, TokenBucket,
};

#[test]
fn the_token_bucket_refills_one_interval_per_missing_permit() {
    let bucket = TokenBucket::new("bucket", 5, Rate::per_second(5)).unwrap();
    let report = bucket.report(&Admission::new(123, 3));
    assert_eq!((report.available, report.capacity), (3, 5));
    assert_eq!(report.until_full, Duration::from_millis(400));
    assert_eq!(
        bucket.report(&Admission::new(0, 5)).until_full,
        Duration::ZERO
    );
}

#[test]
fn the_windows_are_whole_when_their_window_ends() {
    let fixed = FixedWindow::new("window", Rate::per_minute(10)).unwrap();
    // 61.5 s after the epoch: the window [60 s, 120 s) ends in 58.5 s.
    let report = fixed.report(&Admission::new(61_500_000, 4));
    assert_eq!((report.available, report.capacity), (4, 10));
    assert_eq!(report.until_full, Duration::from_millis(58_500));
    // At a window's first microsecond, the whole window is left.
    assert_eq!(
        fixed.report(&Admission::new(60_000_000, 4)).until_full,
        Duration::from_secs(60)
    );

    // The counter weighs the current window into the next one.
    let sliding = ApproxSlidingWindow::new("approx", Rate::per_minute(10)).unwrap();
    assert_eq!(
        sliding.report(&Admission::new(61_500_000, 4)).until_full,
        Duration::from_millis(58_500 + 60_000)
    );

    // The log is whole when the admission's own entries leave the window.
    let log = SlidingLog::new("log", Rate::per_minute(10)).unwrap();
    let report = log.report(&Admission::new(61_500_000, 0));
    assert_eq!((report.available, report.capacity), (0, 10));
    assert_eq!(report.until_full, Duration::from_secs(60));
}
