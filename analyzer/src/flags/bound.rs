//! `--max-trace-size` and `--max-trace-age`, defined once for every
//! command that keeps a stream within a bound.

use anyhow::Result;
use mtrace_analysis::bounded;

/// `--max-trace-size SIZE` and `--max-trace-age DURATION`: the options of
/// every command that keeps a stream within a bound (`run`, `client`,
/// `attach`, `cut`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct BoundArgs {
    /// Keep each process's trace within SIZE bytes (K, M, G suffixes:
    /// powers of 1024; at least 64K): mtrace writes it with checkpoints
    /// and drops its oldest part, so a run of any length still reports
    /// every block live at its end (docs/FORMAT.md, "Checkpoint").
    #[arg(long, value_name = "SIZE", value_parser = bounded::parse_size)]
    pub max_trace_size: Option<u64>,
    /// Keep the last DURATION of each process's trace (10s, 30m, 24h; at
    /// least 1s), the same way: with a checkpoint every quarter of it, the
    /// events before the newest checkpoint at least DURATION old are
    /// dropped (so up to half as much again is kept). With
    /// --max-trace-size, whichever keeps less.
    #[arg(long, value_name = "DURATION", value_parser = mtrace_analysis::report::parse_duration)]
    pub max_trace_age: Option<u64>,
}

impl BoundArgs {
    /// The bound asked for (`None`: neither option), refused in one line
    /// naming the option when too small.
    pub fn bound(&self) -> Result<Option<bounded::Bound>> {
        if let Some(max) = self.max_trace_size {
            bounded::check_bound(max)?;
        }
        if let Some(age) = self.max_trace_age {
            anyhow::ensure!(age >= bounded::MIN_AGE_NS, "--max-trace-age {:.3}s: at least 1s", age as f64 / 1e9);
        }
        let b = bounded::Bound { bytes: self.max_trace_size, age_ns: self.max_trace_age };
        Ok((b != bounded::Bound::default()).then_some(b))
    }
}
