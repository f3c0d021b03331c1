//! What the heap addresses of a trace cost after compression, and what
//! other ways of writing them would cost: re-encodes the allocation, free,
//! realloc and backtrace records of TRACE as the preload's writer does
//! (chunks of about 1 MiB, each thread's run starting afresh) with each
//! address model, compresses each chunk with zstd level 1 (the writer's)
//! and prints bytes per event.
//!
//! Models:
//! - `delta`: the stream's own (the records as [`Encoder`] writes them), a
//!   zigzag delta from the previous address;
//! - `none`: every address written as 0, the share addresses take;
//! - `none, no times`: addresses and times written as 0, what the other
//!   fields (kinds, sizes, backtrace ids, backtraces) take;
//! - `recent-K`: a free whose address is one of the thread's last K
//!   allocated addresses (an allocation: one of its last K freed ones)
//!   written as that position, else as the delta (one flag bit). Costs
//!   the preload a search of K words per event.
//!
//! usage: cargo run --release -p mtrace-format --example address_models TRACE

use mtrace_format::{put_varint, zigzag, Encoder, Reader, Record, TIME_SHIFT};

const CHUNK: usize = 1 << 20;

#[derive(Clone, Copy)]
enum Model {
    Delta,
    None,
    NoTimes,
    Recent(usize),
}

/// One chunk's encoder state for a model other than `Delta`: the
/// stream's record layout, with the address written the model's way
/// (tags are this example's own; only their repetition matters to zstd).
struct Enc {
    model: Model,
    last_time: u64,
    last_addr: u64,
    /// Rings of the last 64 allocated and freed addresses.
    allocated: [u64; 64],
    freed: [u64; 64],
    n_allocated: usize,
    n_freed: usize,
}

impl Enc {
    fn new(model: Model) -> Enc {
        Enc { model, last_time: 0, last_addr: 0, allocated: [0; 64], freed: [0; 64], n_allocated: 0, n_freed: 0 }
    }

    fn time(&mut self, out: &mut Vec<u8>, t: u64) {
        let t = if matches!(self.model, Model::NoTimes) { 0 } else { t >> TIME_SHIFT };
        put_varint(out, zigzag(t.wrapping_sub(self.last_time) as i64));
        self.last_time = t;
    }

    fn addr(&mut self, out: &mut Vec<u8>, a: u64, free: bool) {
        let delta = zigzag(a.wrapping_sub(self.last_addr) as i64);
        match self.model {
            Model::Delta | Model::None | Model::NoTimes => put_varint(out, 0),
            Model::Recent(k) => {
                let (ring, n) = if free { (&self.allocated, self.n_allocated) } else { (&self.freed, self.n_freed) };
                let hit = (0..k.min(n)).find(|&j| ring[(n - 1 - j) % 64] == a);
                match hit {
                    Some(j) => put_varint(out, (j as u64) << 1 | 1),
                    None => put_varint(out, delta << 1),
                }
            }
        }
        self.last_addr = a;
        if free {
            self.freed[self.n_freed % 64] = a;
            self.n_freed += 1;
        } else {
            self.allocated[self.n_allocated % 64] = a;
            self.n_allocated += 1;
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: address_models TRACE")?;
    for model in [Model::Delta, Model::None, Model::NoTimes, Model::Recent(8), Model::Recent(16), Model::Recent(64)] {
        let (events, bytes) = measure(&path, model)?;
        let name = match model {
            Model::Delta => "delta".to_string(),
            Model::None => "none".to_string(),
            Model::NoTimes => "none, no times".to_string(),
            Model::Recent(k) => format!("recent-{k}"),
        };
        println!("{name:>14}: {:.2} bytes per event ({events} events)", bytes as f64 / events as f64);
    }
    Ok(())
}

/// Events of the trace at `path`, and its records' compressed bytes with `model`.
fn measure(path: &str, model: Model) -> Result<(u64, usize), Box<dyn std::error::Error>> {
    let mut r = Reader::new(std::fs::File::open(path)?);
    r.header()?;
    let (mut chunks, mut out, mut enc, mut real) = (Vec::new(), Vec::new(), Enc::new(model), Encoder::new());
    let (mut events, mut tid) = (0u64, None);
    while let Some(rec) = r.next_record()? {
        if out.len() >= CHUNK || tid != Some(r.tid()) {
            if out.len() >= CHUNK {
                chunks.push(std::mem::take(&mut out));
            }
            // A Thread record: every base starts again.
            real.encode(&mut out, &Record::Thread { tid: r.tid(), time_ns: 0 });
            enc = Enc::new(model);
            tid = Some(r.tid());
        }
        let o = &mut out;
        if matches!(rec, Record::Alloc { .. } | Record::Free { .. } | Record::Realloc { .. }) {
            events += 1;
        }
        match rec {
            Record::Stack { .. } => real.encode(o, &rec),
            Record::Alloc { .. } | Record::Free { .. } | Record::Realloc { .. } if matches!(model, Model::Delta) => {
                real.encode(o, &rec)
            }
            Record::Alloc { time_ns, family, addr, size, stack, .. } => {
                o.push(2);
                enc.time(o, time_ns);
                o.push(family as u8);
                enc.addr(o, addr, false);
                put_varint(o, size);
                put_varint(o, stack as u64);
            }
            Record::Free { time_ns, family, addr, stack, .. } => {
                o.push(3);
                enc.time(o, time_ns);
                o.push(family as u8);
                enc.addr(o, addr, true);
                if stack != 0 {
                    put_varint(o, stack as u64);
                }
            }
            Record::Realloc { time_ns, free_time_ns, old, new, size, stack } => {
                o.push(4);
                enc.time(o, time_ns);
                put_varint(o, time_ns.saturating_sub(free_time_ns) >> TIME_SHIFT);
                enc.addr(o, old, true);
                enc.addr(o, new, false);
                put_varint(o, size);
                put_varint(o, stack as u64);
            }
            _ => {}
        }
    }
    chunks.push(out);
    let mut bytes = 0;
    for c in &chunks {
        bytes += zstd::bulk::compress(c, 1)?.len();
    }
    Ok((events, bytes))
}
