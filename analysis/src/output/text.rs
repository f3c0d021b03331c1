//! The report as text: what memcheck users read, with heaptrack's sections
//! on request.

use std::io::{self, Write};

use super::words::{count, frames, mib, plural, secs, thousands};
use super::Style;
use crate::report::Report;
use crate::trace::{MarkerSeen, TimePoint};

/// The markers, one line each: the report point's number (`-` for a
/// marker of another kind), the time after the start, the name. `mtrace
/// report --markers` and the console's `markers`.
pub fn write_markers(markers: &[MarkerSeen], w: &mut dyn Write) -> io::Result<()> {
    writeln!(w, "{:>6}  {:>12}  name", "report", "time")?;
    for m in markers {
        let seq = if m.seq == 0 { "-".to_owned() } else { m.seq.to_string() };
        writeln!(w, "{seq:>6}  {:>10.3} s  {}", m.time_ns as f64 / 1e9, m.name)?;
    }
    Ok(())
}

fn write_timeline(r: &Report, w: &mut dyn Write) -> io::Result<()> {
    let Some(points) = &r.timeline else { return Ok(()) };
    writeln!(w, "\nMemory over time ({} samples shown):", points.len())?;
    write_timeline_table(points, w)
}

/// RSS and the live heap over time, one line per point: the report's
/// `--timeline` and the console's `timeline`.
pub fn write_timeline_table(points: &[TimePoint], w: &mut dyn Write) -> io::Result<()> {
    writeln!(w, "  {:>10}  {:>12}  {:>12}  {:>10}", "time", "RSS", "heap", "blocks")?;
    for p in points {
        writeln!(
            w,
            "  {:>10}  {:>12}  {:>12}  {:>10}",
            secs(p.time_ns),
            mib(p.rss_bytes),
            mib(p.heap_bytes),
            thousands(p.heap_blocks)
        )?;
    }
    Ok(())
}

/// Writes the text report to `w`, in style `s` (frames per backtrace, the
/// sections).
pub fn write_text(r: &Report, s: &Style, w: &mut dyn Write) -> io::Result<()> {
    if let Some(tree) = &r.processes {
        super::processes::write_tree(tree, w)?;
    }
    write_summary(r, w)?;
    super::errors::write_text(&r.errors, s, w)?;
    write_timeline(r, w)?;
    write_entries(r, s, w)?;
    write_intervals(r, s, w)?;
    write_sections(r, s, w)
}

fn write_intervals(r: &Report, s: &Style, w: &mut dyn Write) -> io::Result<()> {
    let Some(x) = &r.intervals else { return Ok(()) };
    writeln!(
        w,
        "\nUnfreed allocations per interval of {} ({} intervals), steadiest growth first:",
        secs(x.duration_ns),
        x.windows
    )?;
    if let Some(asked) = x.asked_ns {
        writeln!(
            w,
            "(intervals of {} would be more than {}: widened to {})",
            secs(asked),
            thousands(crate::report::intervals::MAX_WINDOWS),
            secs(x.duration_ns)
        )?;
    }
    for (i, g) in x.stacks.iter().enumerate() {
        writeln!(
            w,
            "#{}: live memory left in {} of {} intervals, {} bytes/s, {} allocations/s",
            i + 1,
            g.windows_with_growth,
            x.windows,
            thousands(g.bytes_per_s.max(0.0).round() as u64),
            rate(g.allocations_per_s)
        )?;
        let cells: Vec<String> = g.per_window.iter().map(|p| thousands(p.bytes)).collect();
        writeln!(w, "    bytes per interval: {}", cells.join(" "))?;
        frames(&g.frames, s, w)?;
    }
    Ok(())
}

fn write_sections(r: &Report, s: &Style, w: &mut dyn Write) -> io::Result<()> {
    let Some(x) = &r.sections else { return Ok(()) };
    if !s.sections {
        // Asked for on its own.
        return write_older_than(r, s, w);
    }
    writeln!(w, "\nMost allocation calls:")?;
    for (i, e) in x.most_calls.iter().enumerate() {
        writeln!(w, "#{}: {} ({})", i + 1, plural(e.count, "call", "calls"), plural(e.bytes, "byte", "bytes"))?;
        frames(&e.frames, s, w)?;
    }
    writeln!(
        w,
        "\nTemporary allocations (freed before the thread allocated again): {} of {}",
        thousands(x.temporary_total),
        thousands(r.summary.allocations)
    )?;
    for (i, e) in x.temporary.iter().enumerate() {
        writeln!(w, "#{}: {}", i + 1, plural(e.count, "temporary allocation", "temporary allocations"))?;
        frames(&e.frames, s, w)?;
    }
    writeln!(w, "\nPeak memory consumers (at {}):", secs(r.summary.peak_time_ns))?;
    for (i, e) in x.peak_consumers.iter().enumerate() {
        writeln!(w, "#{}: {} in {}", i + 1, plural(e.bytes, "byte", "bytes"), plural(e.count, "block", "blocks"))?;
        frames(&e.frames, s, w)?;
    }
    write_older_than(r, s, w)?;
    writeln!(w, "\nAllocation sizes:")?;
    for b in &x.histogram {
        let size = b.max_size.map_or_else(|| "larger".to_owned(), |m| format!("<= {}", plural(m, "byte", "bytes")));
        writeln!(
            w,
            "  {size:>20}  {:>14}  {:>18}",
            plural(b.calls, "call", "calls"),
            plural(b.bytes, "byte", "bytes")
        )?;
    }
    Ok(())
}

fn write_older_than(r: &Report, s: &Style, w: &mut dyn Write) -> io::Result<()> {
    let Some(old) = r.sections.as_ref().and_then(|x| x.older_than.as_ref()) else { return Ok(()) };
    writeln!(w, "\nStill live, allocated long before the end (--older-than):")?;
    for (i, e) in old.iter().enumerate() {
        writeln!(w, "#{}: {} in {}", i + 1, plural(e.bytes, "byte", "bytes"), plural(e.count, "block", "blocks"))?;
        frames(&e.frames, s, w)?;
    }
    Ok(())
}

fn write_summary(r: &Report, w: &mut dyn Write) -> io::Result<()> {
    let s = &r.summary;
    match r.ran_as() {
        Some(ran) => writeln!(w, "mtrace report for {ran} ({}, pid {})", r.program, r.pid)?,
        None => writeln!(w, "mtrace report for {} (pid {})", r.program, r.pid)?,
    }
    writeln!(w, "  command:          {}", shell_words::join(&r.cmdline))?;
    writeln!(w, "  trace:            {}", r.trace)?;
    writeln!(w, "  duration:         {}", secs(s.duration_ns))?;
    if let Some(rate) = s.sample_rate {
        writeln!(
            w,
            "  sampled:          one allocation per {} allocated, on average: every byte and block count is an estimate;",
            super::words::size_unit(rate)
        )?;
        writeln!(
            w,
            "                    double and invalid frees and temporary allocations are not found (docs/SAMPLING.md)"
        )?;
    }
    writeln!(
        w,
        "  allocation calls: {} ({} in total)",
        thousands(s.allocations),
        plural(s.bytes_allocated, "byte", "bytes")
    )?;
    // A realloc is an allocation call whose freeing of the old block is no
    // free call: said, or calls minus frees would not be what is not freed.
    match s.realloc_frees {
        0 => writeln!(w, "  frees:            {}", thousands(s.frees))?,
        n => writeln!(
            w,
            "  frees:            {} (and {} replaced by realloc)",
            thousands(s.frees),
            plural(n, "block", "blocks")
        )?,
    }
    writeln!(
        w,
        "  peak:             {} in {} at {}",
        plural(s.peak_bytes, "byte", "bytes"),
        plural(s.peak_blocks, "block", "blocks"),
        secs(s.peak_time_ns)
    )?;
    let delta = s.is_change();
    let since = s.since_marker.as_ref().map(|m| format!("marker {m}")).or(s.from_ns.map(secs));
    if let Some(since) = since {
        let until = s.until_marker.as_ref().map(|u| format!("marker {u}")).or(s.to_ns.map(secs));
        writeln!(w, "  change:           since {since} until {}", until.as_deref().unwrap_or("the end"))?;
    } else if let Some(to) = s.to_ns {
        writeln!(w, "  read:             until {}", secs(to))?;
    }
    let what = if delta { "  live change:      " } else { "  not freed:        " };
    writeln!(
        w,
        "{what}{} in {}{}",
        count(s.leaked_bytes, "byte", "bytes", delta),
        count(s.leaked_blocks, "block", "blocks", delta),
        s.leaked_stderr.map_or_else(String::new, |e| format!(" ({})", error_bar(e)))
    )?;
    if s.bad_frees + s.mismatched_frees > 0 {
        let (bad, mis) = (thousands(s.bad_frees), thousands(s.mismatched_frees));
        let below = if s.kept_from_ns.is_some() { "those after the trace's start below" } else { "below" };
        writeln!(w, "  wrong frees:      {bad} double or invalid, {mis} mismatched ({below})")?;
    }
    if let Some(from) = s.kept_from_ns {
        writeln!(
            w,
            "  trace kept from:  {} (the trace's bound dropped the events before; the totals, the peak and every \
             block not freed are the whole run's)",
            secs(from)
        )?;
    }
    if s.unmatched_frees > 0 {
        writeln!(w, "  frees of blocks allocated before tracing: {}", thousands(s.unmatched_frees))?;
    }
    if s.unknown_munmaps > 0 {
        writeln!(w, "  munmaps of ranges the program had not mapped: {}", thousands(s.unknown_munmaps))?;
    }
    match (&s.error, &s.ended_by) {
        (Some(e), _) => writeln!(w, "  WARNING: {e}; the report covers what was read before it")?,
        // Stopped at --until-marker, before any end.
        (None, None) if s.until_marker.is_some() || s.to_ns.is_some() => {}
        (None, None) if s.running => {
            writeln!(w, "  ended by:         nothing yet: still running (the report covers what it wrote so far)")?
        }
        (None, None) => writeln!(
            w,
            "  WARNING: the trace has no end record (the process was killed?); the report covers what was written"
        )?,
        (None, Some(how)) => match (s.exit_status, &s.exec) {
            (Some(status), _) => writeln!(w, "  ended by:         {how}, status {status}")?,
            (None, Some(path)) => writeln!(w, "  ended by:         {how} of {path}")?,
            (None, None) => writeln!(w, "  ended by:         {how}")?,
        },
    }
    for a in r.allocators.iter().filter(|a| a.seen) {
        writeln!(w, "  allocator:        {} in {} ({})", a.label(), a.module, a.how)?;
    }
    for n in &r.notices {
        writeln!(w, "  WARNING: {n}")?;
    }
    Ok(())
}

/// The "not freed" entries of `r` alone (the console's `dump` and `top`).
pub fn write_entries_only(r: &Report, s: &Style, w: &mut dyn Write) -> io::Result<()> {
    write_entries(r, s, w)
}

/// The line before the entries: what they are, or that there are none.
fn write_heading(r: &Report, w: &mut dyn Write) -> io::Result<()> {
    let delta = r.summary.is_change();
    if r.stacks.is_empty() {
        let reachable = r.kinds.as_ref().map_or(0, |k| k.reachable.blocks as i64);
        let lost = r.kinds.as_ref().map_or(0, |k| k.definite.blocks + k.indirect.blocks + k.possible.blocks);
        let what = if delta {
            "No change in live blocks."
        } else if lost > 0 && r.suppressed.is_some() {
            "No leaks left: the suppressions matched every lost block."
        } else if r.kinds.is_some() && r.summary.leaked_blocks > reachable {
            // The program's own mappings are not classified.
            "No leaks: the blocks not freed are still reachable or mappings the program or its allocator made (--show-reachable lists them)."
        } else if r.kinds.is_some() && r.summary.leaked_blocks > 0 {
            "No leaks: every block not freed is still reachable (--show-reachable lists them)."
        } else {
            "All blocks were freed."
        };
        if !r.notices.is_empty() {
            // Not the whole answer: some allocations never reached mtrace.
            let mut what = what.to_owned();
            what[..1].make_ascii_lowercase();
            return writeln!(w, "\nOf the allocations mtrace saw: {what} It did not see them all (the WARNING above).");
        }
        return writeln!(w, "\n{what}");
    }
    let n = plural(r.stacks.len() as u64, "backtrace", "backtraces");
    if r.every_backtrace {
        return writeln!(w, "\nEvery backtrace that allocated, by allocation calls ({n}{}):", estimated(r));
    }
    if r.kinds.is_some() && !delta && r.summary.until_marker.is_none() {
        return if r.show_reachable {
            writeln!(w, "\nNot freed, as the scan classified them, by backtrace ({n}{}):", estimated(r))
        } else {
            writeln!(
                w,
                "\nLeaks, by backtrace ({n}{}; --show-reachable adds the still reachable blocks):",
                estimated(r)
            )
        };
    }
    let at_marker = r.summary.until_marker.as_ref().map(|m| format!("Live at marker {m}"));
    let heading = match (delta, r.summary.ended_by.as_deref()) {
        (true, _) => "Change in live blocks",
        (false, _) if at_marker.is_some() => at_marker.as_deref().unwrap_or_default(),
        (false, Some("detach")) if r.summary.attached => "Allocated while attached and not freed at detach",
        (false, Some("detach")) => "Not freed when tracing stopped (detach)",
        (false, None) => "Live at the end of the trace so far",
        // The preload scans in exit's path (its handlers, a return from
        // main) and at a fatal signal; _exit runs none of it.
        (false, Some("_exit")) => "Not freed at _exit (not scanned: no leak kinds)",
        _ => "Not freed at exit",
    };
    writeln!(w, "\n{heading}, by backtrace ({n}{}):", estimated(r))
}

/// What a heading adds in a sampled report.
fn estimated(r: &Report) -> &'static str {
    if r.summary.sample_rate.is_some() {
        "; estimated from samples"
    } else {
        ""
    }
}

fn write_suppressed(r: &Report, w: &mut dyn Write) -> io::Result<()> {
    let Some(rules) = &r.suppressed else { return Ok(()) };
    let used: Vec<_> = rules.iter().filter(|r| r.entries > 0).collect();
    writeln!(w, "\nSuppressed: {} of {} suppressions used", used.len(), rules.len())?;
    for u in used {
        writeln!(
            w,
            "  {} in {} by leak:{}",
            plural(u.bytes as u64, "byte", "bytes"),
            plural(u.blocks as u64, "block", "blocks"),
            u.pattern
        )?;
    }
    Ok(())
}

/// memcheck's four totals, from the scan.
fn write_leak_summary(r: &Report, w: &mut dyn Write) -> io::Result<()> {
    let Some(k) = &r.kinds else { return Ok(()) };
    match &r.scan {
        Some(s) => {
            let when = match (s.at_exit, r.summary.ended_by.as_deref()) {
                (true, Some(end)) if end != "exit" => format!("at the end ({end})"),
                (true, _) => "at exit".to_owned(),
                _ => format!("at {:.3} s", s.time_s),
            };
            let threads = plural(s.threads_stopped, "thread", "threads");
            let read = plural(s.bytes, "byte", "bytes");
            writeln!(w, "\nLeak summary (memcheck's kinds, from the scan {when}; {threads} stopped, {read} read):")?;
            if s.threads_not_stopped > 0 {
                let n = plural(s.threads_not_stopped, "thread", "threads");
                writeln!(w, "  ({n} could not be stopped: whole stacks counted as roots, registers unknown)")?;
            }
            if let Some(why) = &s.stopped_by_signal {
                writeln!(
                    w,
                    "  (threads stopped by a signal, as ptrace could not be used: {why}; \
                     a system call one waited in may have returned EINTR)"
                )?;
            }
        }
        None => writeln!(w, "\nLeak summary (memcheck's kinds):")?,
    }
    for (what, t) in [
        ("definitely lost", k.definite),
        ("indirectly lost", k.indirect),
        ("possibly lost", k.possible),
        ("still reachable", k.reachable),
    ] {
        writeln!(w, "  {what}: {} in {}", plural(t.bytes, "byte", "bytes"), plural(t.blocks, "block", "blocks"))?;
    }
    if k.mappings.blocks > 0 {
        // The rest of "not freed": no kind of memcheck's.
        let (b, n) = (plural(k.mappings.bytes, "byte", "bytes"), plural(k.mappings.blocks, "mapping", "mappings"));
        writeln!(
            w,
            "  not classified: {b} in {n} the program made (mmap; roots of the scan, --show-reachable lists them)"
        )?;
    }
    let own = k.allocator_mappings;
    if own.blocks > 0 {
        let (b, n) = (plural(own.bytes, "byte", "bytes"), plural(own.blocks, "mapping", "mappings"));
        writeln!(
            w,
            "  not classified: {b} in {n} the allocator made for its own use (not roots of the scan; \
             --show-reachable lists them)"
        )?;
    }
    let via = &k.reachable_via_heuristic;
    if crate::scan::Heuristic::ALL.iter().any(|&h| via.get(h).blocks > 0) {
        writeln!(w, "    of which reachable via heuristic:")?;
        for h in crate::scan::Heuristic::ALL {
            let t = via.get(h);
            let (b, n) = (plural(t.bytes, "byte", "bytes"), plural(t.blocks, "block", "blocks"));
            writeln!(w, "      {:<20} {b} in {n}", format!("{}:", h.name()))?;
        }
    }
    Ok(())
}

/// A rate with one decimal below 100 and thousands separators: "2.5",
/// "12,345".
fn rate(v: f64) -> String {
    match v {
        v if v < 100.0 => format!("{v:.1}"),
        v => thousands(v.round() as u64),
    }
}

/// A sampled estimate's standard error: "± 12,345 bytes, ± 3 blocks: one
/// standard error".
fn error_bar([bytes, blocks]: [u64; 2]) -> String {
    format!("± {}, ± {}: one standard error", plural(bytes, "byte", "bytes"), plural(blocks, "block", "blocks"))
}

/// Under a sampled entry's headline: how far its estimate may be off.
fn write_error_bar(e: &crate::report::LeakEntry, w: &mut dyn Write) -> io::Result<()> {
    match e.stderr {
        Some(bar) if bar != [0, 0] => writeln!(w, "    estimate {}", error_bar(bar)),
        _ => Ok(()),
    }
}

fn write_entries(r: &Report, s: &Style, w: &mut dyn Write) -> io::Result<()> {
    // With a scan, its verdict comes first, then the leaks it found.
    if r.kinds.is_some() {
        write_leak_summary(r, w)?;
        write_suppressed(r, w)?;
        write_heading(r, w)?;
    } else {
        write_heading(r, w)?;
        write_suppressed(r, w)?;
    }
    let delta = r.summary.is_change();
    for (i, e) in r.stacks.iter().enumerate() {
        if let Some(kind) = e.kind {
            let bytes = match (kind, e.indirect_bytes) {
                (crate::scan::Kind::Definite, Some(ind)) => {
                    format!(
                        "{} ({} direct, {} indirect) bytes",
                        thousands(e.bytes as u64 + ind),
                        thousands(e.bytes as u64),
                        thousands(ind)
                    )
                }
                _ => plural(e.bytes as u64, "byte", "bytes"),
            };
            let are = if e.blocks == 1 { "is" } else { "are" };
            writeln!(
                w,
                "\n#{}: {bytes} in {} {are} {} ({}), {} from this backtrace",
                i + 1,
                plural(e.blocks as u64, "block", "blocks"),
                kind.words(),
                e.family,
                plural(e.total_allocations, "allocation", "allocations")
            )?;
            write_error_bar(e, w)?;
            frames(&e.frames, s, w)?;
            continue;
        }
        if e.blocks == 0 && !delta {
            // `--sort stacks`: a backtrace whose blocks were all freed.
            let calls = plural(e.total_allocations, "allocation", "allocations");
            writeln!(w, "\n#{}: every block freed ({}), {calls} from this backtrace", i + 1, e.family)?;
            frames(&e.frames, s, w)?;
            continue;
        }
        writeln!(
            w,
            "\n#{}: {} in {} {} ({}), {} from this backtrace",
            i + 1,
            count(e.bytes, "byte", "bytes", delta),
            count(e.blocks, "block", "blocks", delta),
            if delta { "live" } else { "not freed" },
            e.family,
            plural(e.total_allocations, "allocation", "allocations"),
        )?;
        write_error_bar(e, w)?;
        if let Some(l) = e.lost {
            let (b, n) = (plural(l.bytes, "byte", "bytes"), plural(l.blocks, "block", "blocks"));
            writeln!(w, "    of which lost at the last scan: {b} in {n}")?;
        }
        frames(&e.frames, s, w)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_separators() {
        assert_eq!(super::thousands(0), "0");
        assert_eq!(super::thousands(999), "999");
        assert_eq!(super::thousands(1000), "1,000");
        assert_eq!(super::thousands(1234567), "1,234,567");
    }
}
