//! Metrics read back from metrics-util's debugging recorder, by name and
//! labels: what the `metrics` tests of tollgate-redis and tollgate-tower
//! check. (tollgate-tower's test includes this file by path.)

use std::collections::HashMap;

use metrics_util::debugging::{DebugValue, Snapshotter};

/// Every metric recorded, by name and sorted labels.
pub type Metrics = HashMap<(String, Vec<(String, String)>), DebugValue>;

/// Every metric the recorder holds now.
pub fn read(snapshotter: &Snapshotter) -> Metrics {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            ((key.name().to_owned(), labels), value)
        })
        .collect()
}

fn value<'a>(metrics: &'a Metrics, name: &str, pairs: &[(&str, &str)]) -> Option<&'a DebugValue> {
    let mut labels: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.sort();
    metrics.get(&(name.to_owned(), labels))
}

/// A counter's value; 0 if it was never recorded.
pub fn counter(metrics: &Metrics, name: &str, pairs: &[(&str, &str)]) -> u64 {
    match value(metrics, name, pairs) {
        Some(DebugValue::Counter(value)) => *value,
        None => 0,
        other => panic!("{name} {pairs:?}: {other:?}"),
    }
}

/// A gauge's value; a panic if it was never recorded.
pub fn gauge(metrics: &Metrics, name: &str, pairs: &[(&str, &str)]) -> f64 {
    match value(metrics, name, pairs) {
        Some(DebugValue::Gauge(value)) => value.into_inner(),
        other => panic!("{name} {pairs:?}: {other:?}"),
    }
}

/// A histogram's samples; none if it was never recorded.
pub fn histogram(metrics: &Metrics, name: &str, pairs: &[(&str, &str)]) -> Vec<f64> {
    match value(metrics, name, pairs) {
        Some(DebugValue::Histogram(values)) => values.iter().map(|v| v.into_inner()).collect(),
        None => Vec::new(),
        other => panic!("{name} {pairs:?}: {other:?}"),
    }
}
