//! What each field of a trace's allocation events costs once compressed,
//! for the design of a compact trace (issue 68, item 2): the trace's
//! Alloc and Free events re-encoded by a small encoder shaped like the
//! stream's (tag, time delta, family, address delta from the previous
//! one, size, stack id; Thread records where the thread changes, Stack
//! records as they come), once as they are and once per variant with one
//! field dropped, coarsened or replaced, each compressed as the writer
//! compresses (zstd level 1, 60 KiB rounds). Reallocs are counted as
//! events and not encoded.
//!
//! usage: cargo run --release -p mtrace-format --example field_cost -- TRACE [VARIANT...]
//! (every variant when none is named: see [`V`])

use std::collections::HashMap;

use mtrace_format::{put_varint, zigzag, Reader, Record};

/// The variants, by the name the command line takes.
#[derive(Clone, Copy, PartialEq, Debug)]
enum V {
    /// The fields as the stream has them (times in 64 ns units).
    Base,
    /// No times.
    NoTime,
    /// Times in 1,024 ns units.
    Time1us,
    /// Times in 16,384 ns units.
    Time16us,
    /// No address in an Alloc.
    NoAllocAddr,
    /// No address in a Free.
    NoFreeAddr,
    /// A Free names its block by its age: allocations made since it.
    FreeAge,
    /// Every size 0.
    NoSize,
    /// Every stack id 0.
    NoStack,
    /// An Alloc names its (size, stack) pair by the pair's number.
    PairId,
    /// As heaptrack's trace: no times, no addresses, an Alloc and a Free
    /// each the number of the block's (size, stack) pair.
    Heaptrackish,
    /// Heaptrackish with times in 16,384 ns units.
    Pairs16us,
    /// Heaptrackish with times in 1,048,576 ns units.
    Pairs1ms,
    /// Times in 16,384 ns units, an Alloc its pair's number, a Free its
    /// block's age: what a consumer that numbers allocations could write.
    Age16us,
}

const ALL: [V; 14] = [
    V::Base,
    V::NoTime,
    V::Time1us,
    V::Time16us,
    V::NoAllocAddr,
    V::NoFreeAddr,
    V::FreeAge,
    V::NoSize,
    V::NoStack,
    V::PairId,
    V::Heaptrackish,
    V::Pairs16us,
    V::Pairs1ms,
    V::Age16us,
];

/// The small encoder and what it compressed so far.
#[derive(Default)]
struct Enc {
    last_time: u64,
    last_addr: u64,
    out: Vec<u8>,
    plain: u64,
    compressed: u64,
}

impl Enc {
    fn time(&mut self, time_ns: u64, v: V) {
        let t = match v {
            V::NoTime | V::Heaptrackish => 0,
            V::Time1us => time_ns >> 10,
            V::Time16us | V::Pairs16us | V::Age16us => time_ns >> 14,
            V::Pairs1ms => time_ns >> 20,
            _ => time_ns >> 6,
        };
        put_varint(&mut self.out, zigzag(t.wrapping_sub(self.last_time) as i64));
        self.last_time = t;
    }

    fn addr(&mut self, a: u64) {
        put_varint(&mut self.out, zigzag(a.wrapping_sub(self.last_addr) as i64));
        self.last_addr = a;
    }

    /// Compresses the round once it is 60 KiB (or at the `end`).
    fn round(&mut self, end: bool) {
        if self.out.len() >= 60 << 10 || (end && !self.out.is_empty()) {
            self.plain += self.out.len() as u64;
            self.compressed += zstd::bulk::compress(&self.out, 1).expect("zstd").len() as u64;
            self.out.clear();
        }
    }
}

/// Encodes `path`'s events as `v` asks: (events, plain bytes, compressed bytes).
fn measure(path: &str, v: V) -> Result<(u64, u64, u64), Box<dyn std::error::Error>> {
    use V::*;
    let mut r = Reader::new(std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(path)?));
    r.header()?;
    let mut e = Enc::default();
    let mut events = 0u64;
    // Live blocks: address -> (allocation number, pair number).
    let mut live: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut pairs: HashMap<(u64, u32), u64> = HashMap::new();
    let (mut allocations, mut tid_now) = (0u64, 0u32);
    loop {
        let rec = match r.next_record() {
            Ok(Some(rec)) => rec,
            Ok(None) => break,
            Err(err) => {
                eprintln!("{path}: read up to an error: {err}");
                break;
            }
        };
        match rec {
            Record::Thread { tid, .. } if tid != tid_now => {
                e.out.push(1);
                put_varint(&mut e.out, tid as u64);
                tid_now = tid;
            }
            Record::Stack { id, frames } => {
                e.out.push(2);
                put_varint(&mut e.out, id as u64);
                put_varint(&mut e.out, frames.len() as u64);
                for f in frames {
                    put_varint(&mut e.out, f);
                }
            }
            Record::Alloc { time_ns, family, addr, size, stack, .. } => {
                events += 1;
                allocations += 1;
                let next = pairs.len() as u64;
                let pair = *pairs.entry((size, stack)).or_insert(next);
                live.insert(addr, (allocations, pair));
                e.out.push(3);
                e.time(time_ns, v);
                e.out.push(family as u8);
                let by_pair = matches!(v, PairId | Heaptrackish | Pairs16us | Pairs1ms | Age16us);
                if !matches!(v, NoAllocAddr | Heaptrackish | Pairs16us | Pairs1ms | Age16us) {
                    e.addr(addr);
                }
                if by_pair {
                    put_varint(&mut e.out, pair);
                } else {
                    put_varint(&mut e.out, if v == NoSize { 0 } else { size });
                    put_varint(&mut e.out, if v == NoStack { 0 } else { stack as u64 });
                }
            }
            Record::Free { time_ns, family, addr, stack, .. } => {
                events += 1;
                let known = live.remove(&addr);
                e.out.push(4);
                e.time(time_ns, v);
                e.out.push(family as u8);
                match (v, known) {
                    (NoFreeAddr, _) => {}
                    (FreeAge | Age16us, Some((no, _))) => put_varint(&mut e.out, allocations - no),
                    (Heaptrackish | Pairs16us | Pairs1ms, Some((_, pair))) => put_varint(&mut e.out, pair),
                    _ => e.addr(addr),
                }
                put_varint(&mut e.out, if v == NoStack { 0 } else { stack as u64 });
            }
            Record::Realloc { .. } => events += 1,
            _ => {}
        }
        e.round(false);
    }
    e.round(true);
    Ok((events, e.plain, e.compressed))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        return Err("usage: field_cost TRACE [VARIANT...]".into());
    };
    let want: Vec<String> = args.collect();
    for v in ALL.into_iter().filter(|v| want.is_empty() || want.contains(&format!("{v:?}"))) {
        let (events, plain, compressed) = measure(&path, v)?;
        let per = |b: u64| b as f64 / events.max(1) as f64;
        println!(
            "{:14} {events} events: {:.2} bytes per event plain, {:.3} compressed",
            format!("{v:?}"),
            per(plain),
            per(compressed)
        );
    }
    Ok(())
}
