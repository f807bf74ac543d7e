//! Latency summaries. The worst case is what matters for loaders: one slow read in
//! the middle of GPU work is what times a Metal command buffer out, however good
//! the average is. p99 shows whether the worst is a one-off or a pattern.

use std::time::Duration;

use serde_json::{Value, json};

/// Worst, p99 and median of a set of timed operations, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Summary {
    pub(crate) worst_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) median_ms: f64,
}

impl Summary {
    /// Summarises `samples` (in any order); all zero when there are none.
    pub(crate) fn of(mut samples: Vec<Duration>) -> Summary {
        samples.sort_unstable();
        Summary {
            worst_ms: ms(samples.last().copied()),
            p99_ms: ms(rank(&samples, 0.99)),
            median_ms: ms(rank(&samples, 0.50)),
        }
    }

    /// The summary as JSON fields, named with `prefix`.
    pub(crate) fn to_json(self, prefix: &str) -> Value {
        json!({
            format!("worst_{prefix}_ms"): self.worst_ms,
            format!("p99_{prefix}_ms"): self.p99_ms,
            format!("median_{prefix}_ms"): self.median_ms,
        })
    }
}

/// Nearest-rank percentile: the smallest sample with at least `q` of all samples at or
/// below it, so p99 of 100 samples is the 99th, never an interpolated value.
fn rank(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let index = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted.get(index).copied()
}

fn ms(d: Option<Duration>) -> f64 {
    d.map_or(0.0, |d| d.as_nanos() as f64 / 1e6)
}

/// Merges JSON objects; later keys win.
pub(crate) fn merge(mut base: Value, extra: Value) -> Value {
    if let (Some(base), Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
    base
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let s = Summary::of(samples);
        assert_eq!(s.worst_ms, 100.0);
        assert_eq!(s.p99_ms, 99.0);
        assert_eq!(s.median_ms, 50.0);
        assert_eq!(Summary::of(Vec::new()).worst_ms, 0.0);
    }
}
