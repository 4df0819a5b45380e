//! [`Stats`] and the log2 latency histogram.

use std::time::Duration;

/// Number of histogram buckets: bucket `i` counts latencies in `[2^i, 2^(i+1))` µs (bucket 0 also
/// holds 0 µs); the last bucket takes everything longer.
pub const BUCKETS: usize = 32;

/// Latency histogram with log2 buckets in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LatencyHistogram {
    counts: [u64; BUCKETS],
    total: u64,
}

impl LatencyHistogram {
    /// Records one latency.
    pub fn record(&mut self, latency: Duration) {
        let us = latency.as_micros().min(u64::MAX as u128) as u64;
        let b = if us <= 1 {
            0
        } else {
            (63 - us.leading_zeros() as usize).min(BUCKETS - 1)
        };
        self.counts[b] += 1;
        self.total += 1;
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Per-bucket counts (see [`BUCKETS`]).
    pub fn buckets(&self) -> &[u64; BUCKETS] {
        &self.counts
    }

    /// The `q` quantile (0..=1) as the upper bound of its bucket in µs (`2^(i+1)`), so a resolution of a
    /// factor of two; `None` when empty.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(1u64 << (i + 1));
            }
        }
        Some(1u64 << BUCKETS)
    }

    /// Median latency bucket bound, µs.
    pub fn p50_us(&self) -> Option<u64> {
        self.quantile_us(0.5)
    }
    /// 90th percentile bucket bound, µs.
    pub fn p90_us(&self) -> Option<u64> {
        self.quantile_us(0.9)
    }
    /// 99th percentile bucket bound, µs.
    pub fn p99_us(&self) -> Option<u64> {
        self.quantile_us(0.99)
    }
}

/// A snapshot of an engine's counters ([`crate::IoEngine::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests completed (successfully or not); a `read_sequential` call is one request.
    pub requests: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Read system calls' worth of reads issued: one per coalesced group, one per sequential chunk.
    pub reads: u64,
    /// Requests served by a read shared with another request (saved reads).
    pub merged_requests: u64,
    /// Bytes delivered to callers.
    pub bytes_read: u64,
    /// Highest number of requests in flight seen at submission (never above the queue depth).
    pub max_in_flight: usize,
    /// Highest number of reads the I/O thread had queued in the kernel at once (Linux AIO, see
    /// [`crate::IoConfig::async_io`]); 1 when every read was a blocking `pread`, 0 before any read.
    pub max_device_depth: usize,
    /// Reads issued through kernel asynchronous I/O (a subset of [`Stats::reads`]; the rest were `pread`s).
    pub async_reads: u64,
    /// Submission-to-completion latency of every request.
    pub latency: LatencyHistogram,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_follow_buckets() {
        let mut h = LatencyHistogram::default();
        assert_eq!(h.p50_us(), None);
        for _ in 0..90 {
            h.record(Duration::from_micros(100)); // bucket 6: [64, 128)
        }
        for _ in 0..9 {
            h.record(Duration::from_micros(1000)); // bucket 9: [512, 1024)
        }
        h.record(Duration::from_secs(10)); // bucket 23
        assert_eq!(h.count(), 100);
        assert_eq!(h.p50_us(), Some(128));
        assert_eq!(h.p90_us(), Some(128));
        assert_eq!(h.p99_us(), Some(1024));
        assert_eq!(h.quantile_us(1.0), Some(1 << 24));
        assert_eq!(h.buckets()[6], 90);
    }
}
