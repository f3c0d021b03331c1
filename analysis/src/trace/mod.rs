//! The data model every part of the analyzer shares: one trace as read —
//! its header, books, backtraces, modules, markers, timeline and the leak
//! scan's snapshot. The readers (`input`) fill it; the books, the scan, the
//! symbolizer, the reports and the outputs read it. It depends on nothing
//! above it.

use std::path::{Path, PathBuf};

use mtrace_format::{EndReason, Header, Module, ReadError};
use rustc_hash::FxHashMap as HashMap;

use crate::books::Books;

mod region;
mod stacks;
mod values;
pub use region::{Region, Word};
pub use stacks::Stacks;

/// A module as first seen in the stream.
pub struct ModuleSeen {
    /// The module.
    pub module: Module,
    /// ns since the start when the module list containing it was recorded.
    pub time: u64,
}

/// Which marker `--since-marker`/`--until-marker` mean: a number selects
/// incremental report `seq`, `NAME#K` the K-th marker named NAME (from 1),
/// anything else the first marker named so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkerSel(pub String);

impl MarkerSel {
    /// Whether the marker `seq`/`name`, the `nth` of that name (from 1), is selected.
    pub fn matches(&self, seq: u64, name: &str, nth: usize) -> bool {
        if let Ok(n) = self.0.parse::<u64>() {
            return n != 0 && n == seq;
        }
        match self.0.rsplit_once('#').and_then(|(n, k)| Some((n, k.parse::<usize>().ok()?))) {
            Some((n, k)) => n == name && k == nth,
            None => self.0 == name,
        }
    }
}
/// Where reading starts counting and stops.
#[derive(Clone, Debug, Default)]
pub struct Window {
    /// Report the change since this marker (live blocks there are the baseline).
    pub since: Option<MarkerSel>,
    /// Stop reading at this marker.
    pub until: Option<MarkerSel>,
    /// Report the change since this time (ns since the start): the live
    /// blocks before the first event at or after it are the baseline.
    pub from_ns: Option<u64>,
    /// Stop reading before the first event after this time (ns).
    pub to_ns: Option<u64>,
    /// Also keep when each backtrace's blocks lived ([`crate::books::lifetimes`]).
    pub lifetimes: bool,
}

/// A marker as read: report number (0 for a named point), name, time (ns).
#[derive(Clone, Debug, serde::Serialize)]
pub struct MarkerSeen {
    /// Report number (0 for a named point).
    pub seq: u64,
    /// Its name.
    pub name: String,
    /// When, ns since the start.
    pub time_ns: u64,
}

/// Memory at one moment: the process's RSS sample and the books' live heap.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct TimePoint {
    /// When, ns since the start.
    pub time_ns: u64,
    /// Resident set size, bytes.
    pub rss_bytes: u64,
    /// Bytes live in the books (heap blocks and mappings).
    pub heap_bytes: u64,
    /// Blocks live in the books.
    pub heap_blocks: u64,
}

/// Everything read from one trace.
pub struct Trace {
    /// Where it was read from.
    pub path: PathBuf,
    /// The stream's header.
    pub header: Header,
    /// The books kept from its records.
    pub books: Books,
    /// Its backtraces.
    pub stacks: Stacks,
    /// Every module list's modules, as first seen.
    pub modules: Vec<ModuleSeen>,
    /// The End record, if the producer wrote one.
    pub end: Option<EndReason>,
    /// Latest time seen, ns since the start.
    pub last_time: u64,
    /// Why reading stopped early (truncated or corrupt), if it did.
    pub error: Option<ReadError>,
    /// Records read.
    pub records: u64,
    /// Every marker read, in stream order.
    pub markers: Vec<MarkerSeen>,
    /// Live bytes and blocks per canonical backtrace at the `since` marker.
    pub baseline: Option<HashMap<u32, crate::books::LiveTotals>>,
    /// The `until` marker was reached (reading stopped there).
    pub reached_until: bool,
    /// One point per RSS sample, in stream order.
    pub timeline: Vec<TimePoint>,
    /// Temporary allocations and the size histogram.
    pub stats: crate::stats::RunStats,
    /// Pool names (`mtrace_alloc`), by id.
    pub pools: HashMap<u32, String>,
    /// The memory snapshot for the leak scan (`MTRACE_SCAN=1`), if complete.
    pub snapshot: Option<Vec<Region>>,
    /// When the snapshot was taken, ns: later blocks are not in it.
    pub snapshot_time: u64,
    /// The last snapshot was an on-demand scan (a "scan" marker follows it).
    pub snapshot_on_demand: bool,
    /// Its threads were stopped by a signal handler, not from outside
    /// (docs/SCAN.md): why, as the producer said.
    pub snapshot_stopped_by_signal: Option<String>,
    /// Traced from an attach (`mtrace attach`; an [`ATTACH_MARKER`] marker):
    /// the blocks allocated before it are unknown.
    pub attached: bool,
    /// Allocation functions the producer hooked by patching their entry
    /// ([`mtrace_format::Record::Patched`]), per module, in stream order.
    pub patched: Vec<mtrace_format::Patch>,
    /// What the process asked `exec` to run last
    /// ([`mtrace_format::Record::Exec`]): where an End of reason exec
    /// follows, the image after this one.
    pub exec: Option<String>,
    /// Children started where the producer's tracing may not follow them
    /// ([`mtrace_format::Record::Spawned`]): (when, ns since the start;
    /// pid; what they were to run).
    pub spawned: Vec<(u64, u32, String)>,
    /// Where the program asked for the report of a report point to go
    /// ([`mtrace_format::Record::ReportTo`], on a socket stream): (seq,
    /// path), until the reader that writes it takes it
    /// (`bounded::ReportPoints`).
    pub report_to: Vec<(u64, String)>,
    /// The stream starts at a checkpoint of this time (ns since the
    /// start): a bounded trace (`mtrace run --max-trace-size`) whose older
    /// part was dropped; its books were restored from it.
    pub kept_from: Option<u64>,
}

/// Name of the marker the preload writes after an on-demand leak scan.
pub const SCAN_MARKER: &str = mtrace_format::protocol::marker::SCAN;

/// Name of the marker that starts a stream made by `mtrace attach`.
pub const ATTACH_MARKER: &str = mtrace_format::protocol::marker::ATTACH;

impl Trace {
    /// An empty trace of the process `header` describes.
    pub fn new(path: &Path, header: Header) -> Trace {
        Trace {
            path: path.to_owned(),
            header,
            books: Books::default(),
            stacks: Stacks::default(),
            modules: Vec::new(),
            end: None,
            last_time: 0,
            error: None,
            records: 0,
            markers: Vec::new(),
            baseline: None,
            reached_until: false,
            timeline: Vec::new(),
            stats: Default::default(),
            pools: HashMap::default(),
            snapshot: None,
            snapshot_time: u64::MAX,
            snapshot_on_demand: false,
            snapshot_stopped_by_signal: None,
            attached: false,
            patched: Vec::new(),
            exec: None,
            spawned: Vec::new(),
            report_to: Vec::new(),
            kept_from: None,
        }
    }
}
