use super::*;
use crate::pipeline::following::tests::{stream, untimed};

/// The stream of `stream(77)` as one plain byte string (no compressed
/// block: a producer with `MTRACE_COMPRESS=off`).
fn plain() -> Vec<u8> {
    stream(77).concat()
}

/// Compressed blocks in the trace file at `path`, and its records.
fn blocks_and_records(path: &Path) -> (u64, u64) {
    let mut r = Reader::new(std::fs::File::open(path).unwrap());
    r.header().unwrap();
    let mut n = 0;
    while r.next_record().unwrap().is_some() {
        n += 1;
    }
    (r.blocks(), n)
}

#[test]
fn a_plain_stream_is_kept_compressed_with_the_books_of_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let opts = ReportOpts::default();
    let src = plain();
    // The stream's header says ppid 0: a child of "process 0".
    let kept = keep(&src[..], Dest::Dir(dir.path()), Bound::default(), None, Some((&opts, 0))).unwrap();
    assert_eq!((kept.pid, kept.start_ns, kept.error.as_deref()), (77, 1_000, None));
    // The file holds the same records, in compressed blocks.
    let (blocks, records) = blocks_and_records(&kept.path);
    let mut r = Reader::new(&src[..]);
    r.header().unwrap();
    let plain_records = std::iter::from_fn(|| r.next_record().unwrap()).count() as u64;
    assert_eq!(records, plain_records);
    assert!(blocks >= 1, "{blocks} blocks");
    let len = std::fs::metadata(&kept.path).unwrap().len();
    assert!(len < src.len() as u64 / 2, "{len} bytes kept of {}", src.len());
    // Its books are those of the report of the file.
    let (t, sym) = kept.books.expect("the books of the child's stream").into_loaded().unwrap();
    assert_eq!(t.books.allocations, 1_001);
    let live = opts.report_loaded((t, sym), Some(&mut Vec::new()), |_, _, _| {}).unwrap().report.unwrap();
    let after = opts.report(&kept.path, Some(&mut Vec::new())).unwrap().report.unwrap();
    assert_eq!(untimed(&live), untimed(&after));
    assert_eq!((after.summary.leaked_bytes, after.summary.leaked_blocks), (24, 1));
}

#[test]
fn books_only_of_the_parents_children_and_without_a_bound() {
    let dir = tempfile::tempdir().unwrap();
    let opts = ReportOpts::default();
    let src = plain();
    let other_parent = keep(&src[..], Dest::Dir(dir.path()), Bound::default(), None, Some((&opts, 5))).unwrap();
    assert!(other_parent.books.is_none());
    let bound = Bound { bytes: Some(1 << 20), age_ns: None };
    let bounded = keep(&src[..], Dest::Dir(dir.path()), bound, None, Some((&opts, 0))).unwrap();
    assert!(bounded.books.is_none());
    // A report of part of the trace reads the file after.
    let marked = ReportOpts { since_marker: Some("m".into()), ..ReportOpts::default() };
    let windowed = keep(&src[..], Dest::Dir(dir.path()), Bound::default(), None, Some((&marked, 0))).unwrap();
    assert!(windowed.books.is_none());
    // Each of the three made a file of its own (`.1`, `.2`: never over another).
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);
}
