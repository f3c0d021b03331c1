//! How well, and how fast, a trace's records compress at other zstd
//! levels: re-encodes the records of TRACE as the preload's writer does
//! (chunks of about 1 MiB, each starting with a Thread record) and times
//! zstd on them.
//!
//! usage: cargo run --release -p mtrace-format --example recompress TRACE

use std::time::Instant;

use mtrace_format::{Encoder, Reader, Record};

const CHUNK: usize = 1 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: recompress TRACE")?;
    let mut r = Reader::new(std::fs::File::open(&path)?);
    r.header()?;
    let (mut chunks, mut cur, mut enc) = (Vec::new(), Vec::new(), Encoder::new());
    let (mut events, mut tid) = (0u64, None);
    while let Some(rec) = r.next_record()? {
        if matches!(rec, Record::Alloc { .. } | Record::Free { .. } | Record::Realloc { .. }) {
            events += 1;
        }
        // A new chunk, or another thread's records: start with its Thread
        // record, as each writer buffer does.
        if cur.len() >= CHUNK || tid != Some(r.tid()) {
            if cur.len() >= CHUNK {
                chunks.push(std::mem::take(&mut cur));
            }
            if !matches!(rec, Record::Thread { .. }) {
                let time_ns = rec.time_ns().unwrap_or(0);
                enc.encode(&mut cur, &Record::Thread { tid: r.tid(), time_ns });
            }
            tid = Some(r.tid());
        }
        enc.encode(&mut cur, &rec);
    }
    chunks.push(cur);
    let raw: usize = chunks.iter().map(Vec::len).sum();
    println!("{events} allocation/free events, {raw} bytes of records ({:.2} per event)", raw as f64 / events as f64);
    for level in [1, 3, 9, 19, -1, -3, -5] {
        let t = Instant::now();
        let mut out = 0;
        for c in &chunks {
            out += zstd::bulk::compress(c, level)?.len();
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "zstd {level:3}: {out} bytes ({:.2} per event, {:.2}x) in {s:.3} s ({:.0} MB/s)",
            out as f64 / events as f64,
            raw as f64 / out as f64,
            raw as f64 / s / 1e6
        );
    }
    Ok(())
}
