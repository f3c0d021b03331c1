//! Tests of the decoder (and of the encoder, through round trips).

use super::*;
use crate::{encode_header, region_kind, Encoder};

/// Records of every kind, with times in whole time units (64 ns) so that
/// they read back exactly.
fn sample() -> (Vec<u8>, Vec<Record>) {
    let h = Header {
        version: VERSION,
        pointer_size: 8,
        arch: "x86_64".into(),
        pid: 42,
        ppid: 1,
        exe: "/bin/true".into(),
        cmdline: vec!["true".into(), "x y".into()],
        start_realtime_ns: 1_700_000_000_000_000_000,
        start_monotonic_ns: 123,
        ..Header::default()
    };
    let recs = vec![
        Record::Thread { tid: 7, time_ns: 1000 << 6 },
        Record::Stack { id: 1, frames: vec![0x401000, 0x400ff0, 0x7fff_0000_1234] },
        Record::Alloc { time_ns: 1500 << 6, family: Family::New, addr: 0x5555_0000, size: 24, stack: 1, align: 0 },
        Record::Realloc {
            time_ns: 1400 << 6,
            free_time_ns: 1390 << 6,
            old: 0x5555_0000,
            new: 0x5555_1000,
            size: 48,
            stack: 1,
        },
        Record::Free { time_ns: 2000 << 6, family: Family::Malloc, addr: 0x5555_1000, stack: 0, align: 0, size: 0 },
        Record::Free { time_ns: 2010 << 6, family: Family::NewArray, addr: 0x5555_2000, stack: 1, align: 0, size: 0 },
        Record::Free { time_ns: 2015 << 6, family: Family::Shared, addr: 0x5555_3000, stack: 0, align: 0, size: 0 },
        Record::Coverage { time_ns: 2020 << 6, collecting: true, whole: true },
        Record::Coverage { time_ns: 2030 << 6, collecting: false, whole: false },
        Record::Coverage { time_ns: 2040 << 6, collecting: true, whole: false },
        Record::Mmap { time_ns: 2100 << 6, addr: 0x7f00_0000_0000, len: 8192, prot: 3, flags: 0x22, fd: -1, stack: 1 },
        Record::Munmap { time_ns: 2200 << 6, addr: 0x7f00_0000_1000, len: 4096 },
        Record::Mremap { time_ns: 2300 << 6, old: 1, old_len: 2, new: 3, new_len: 4, stack: 1 },
        Record::Modules {
            time_ns: 2400 << 6,
            modules: vec![Module {
                path: "/lib/x.so".into(),
                bias: 0x7f00_0000,
                build_id: vec![1, 2, 3],
                segments: vec![Segment { vaddr: 0, memsz: 4096, flags: 5 }],
            }],
        },
        Record::Marker { time_ns: 2450 << 6, seq: 1, name: "signal".into() },
        Record::Sample { time_ns: 2460 << 6, rss: 12 << 20 },
        Record::PoolName { id: 3, name: "conn".into() },
        Record::PoolAlloc { time_ns: 2470 << 6, pool: 3, addr: 42, size: 1, stack: 1 },
        Record::PoolFree { time_ns: 2480 << 6, pool: 3, addr: 42 },
        Record::ScanRegion { time_ns: 2490 << 6, kind: 2, addr: 0x1000, bytes: vec![7; 300] },
        Record::ScanEnd { time_ns: 2491 << 6 },
        Record::Patched {
            time_ns: 2492 << 6,
            patch: Box::new(crate::Patch {
                path: "/usr/bin/prog".into(),
                hooked: vec!["malloc".into(), "tc_malloc".into()],
                refused: vec![("_Znwm".into(), "a call among its first 5 bytes".into())],
            }),
        },
        // Absolute, and the current time is untouched: the End's delta
        // below is still from the ScanEnd's.
        Record::Watermark { time_ns: 2400 << 6 },
        Record::Exec { time_ns: 2493 << 6, path: "sh".into() },
        Record::ReportTo { time_ns: 2493 << 6, seq: 2, path: "/tmp/x.memlog".into() },
        Record::Spawned { time_ns: 2494 << 6, pid: 4321, path: "/bin/busybox".into() },
        // Absolute times, like the watermark's.
        Record::Checkpoint {
            time_ns: 2495 << 6,
            totals: vec![("allocations".into(), 9), ("peak_bytes".into(), 1 << 40)],
        },
        Record::CheckpointEnd {
            time_ns: 2495 << 6,
            stacks: vec![crate::StackSum { id: 1, allocations: 3, bytes: 72, peak_bytes: 48, peak_blocks: 1 }],
        },
        Record::End { time_ns: 2500 << 6, reason: EndReason::Signal(11) },
    ];
    let mut out = Vec::new();
    encode_header(&mut out, &h);
    let mut e = Encoder::new();
    for r in &recs {
        e.encode(&mut out, r);
    }
    (out, recs)
}

#[test]
fn round_trip() {
    let (bytes, recs) = sample();
    let mut r = Reader::new(&bytes[..]);
    let h = r.header().unwrap();
    assert_eq!(h.pid, 42);
    assert_eq!(h.cmdline, vec!["true".to_string(), "x y".to_string()]);
    for want in &recs {
        assert_eq!(r.next_record().unwrap().as_ref(), Some(want));
    }
    assert_eq!(r.tid(), 7);
    assert!(r.next_record().unwrap().is_none());
}

#[test]
fn records_read_into_one_slot_are_the_records() {
    // Each record of every kind written over the one before (a Stack's or
    // a Modules' vector dropped by the next); at the end, and at an
    // error, the slot keeps the last record.
    let (bytes, recs) = sample();
    let mut r = Reader::new(&bytes[..]);
    r.header().unwrap();
    let mut slot = Record::EMPTY;
    for want in &recs {
        assert!(r.next_into(&mut slot).unwrap());
        assert_eq!(&slot, want);
    }
    assert!(!r.next_into(&mut slot).unwrap());
    assert_eq!(Some(&slot), recs.last());
    let mut r = Reader::new(&bytes[..bytes.len() - 1]);
    r.header().unwrap();
    let err = loop {
        match r.next_into(&mut slot) {
            Ok(true) => {}
            Ok(false) => panic!("cut stream read as complete"),
            Err(e) => break e,
        }
    };
    assert!(matches!(err.kind, ReadErrorKind::Truncated));
    assert_eq!(Some(&slot), recs.get(recs.len() - 2));
}

#[test]
fn truncation_reports_last_complete_record() {
    let (bytes, _) = sample();
    // Find where the last record starts by reading the whole stream.
    let mut r = Reader::new(&bytes[..]);
    r.header().unwrap();
    let mut starts = vec![];
    loop {
        let at = r.offset();
        if r.next_record().unwrap().is_none() {
            break;
        }
        starts.push(at);
    }
    let last = *starts.last().unwrap();
    let cut = &bytes[..last as usize + 2];
    let mut r = Reader::new(cut);
    r.header().unwrap();
    let mut n = 0;
    let err = loop {
        match r.next_record() {
            Ok(Some(_)) => n += 1,
            Ok(None) => panic!("cut stream read as complete"),
            Err(e) => break e,
        }
    };
    assert_eq!(n, starts.len() - 1);
    assert!(matches!(err.kind, ReadErrorKind::Truncated));
    assert_eq!(err.offset, last);
}

#[test]
fn compressed_blocks_read_like_plain_records() {
    let (plain, recs) = sample();
    let mut r = Reader::new(&plain[..]);
    r.header().unwrap();
    let body = r.offset() as usize;
    // Header, the first two records plain, the rest in one block.
    let mut starts = vec![];
    while r.next_record().unwrap().is_some() {
        starts.push(r.offset() as usize);
    }
    let split = starts[1];
    let mut mixed = plain[..split].to_vec();
    let block_at = mixed.len() as u64;
    crate::encode_compressed(&mut mixed, &plain[split..], 3).unwrap();
    assert!(mixed.len() < plain.len() + 16);
    let mut r = Reader::new(&mixed[..]);
    r.header().unwrap();
    assert_eq!(r.offset() as usize, body);
    for want in &recs {
        assert_eq!(r.next_record().unwrap().as_ref(), Some(want));
    }
    assert!(r.next_record().unwrap().is_none());
    assert_eq!(r.offset(), mixed.len() as u64);
    // Cut inside the block: truncated at the block's start.
    let mut r = Reader::new(&mixed[..mixed.len() - 3]);
    r.header().unwrap();
    r.next_record().unwrap();
    r.next_record().unwrap();
    let e = r.next_record().unwrap_err();
    assert!(matches!(e.kind, ReadErrorKind::Truncated));
    assert_eq!(e.offset, block_at);
}

#[test]
fn bad_magic_and_empty() {
    let e = Reader::new(&b"hello world"[..]).header().unwrap_err();
    assert!(matches!(e.kind, ReadErrorKind::BadMagic));
    let e = Reader::new(&b""[..]).header().unwrap_err();
    assert!(e.to_string().contains("empty"));
}

#[test]
fn a_newer_version_is_told_from_bytes_that_are_no_header() {
    let header = |rest: &[u8]| {
        let mut b = MAGIC.to_vec();
        b.extend(rest);
        Reader::new(&b[..]).header().unwrap_err().to_string()
    };
    // A newer mtrace's header: its version said.
    assert_eq!(
        header(&[VERSION as u8 + 1, 8, 0, 6]),
        format!("trace format version {} is newer than this mtrace understands ({VERSION})", VERSION + 1)
    );
    // The magic, then bytes no producer writes: corrupt (issue 65, item 6:
    // random bytes were "version 584159" or "truncated").
    assert_eq!(
        header(&[0xdf, 0xd3, 0x23, 0x91, 0x7f]),
        "corrupt record at byte 0: header of format version 584159, pointer size 145, byte order 127"
    );
    assert!(header(&[VERSION as u8, 8, 2]).contains("byte order 2"));
    let mut long_arch = vec![VERSION as u8, 8, 0, 100];
    long_arch.extend([b'x'; 100]);
    assert!(header(&long_arch).starts_with("corrupt record at byte 0: header's architecture"));
}

#[test]
fn unknown_tag_is_corrupt_with_offset() {
    let (mut bytes, _) = sample();
    let mut r = Reader::new(&bytes[..]);
    r.header().unwrap();
    let at = r.offset() as usize;
    bytes[at] = 200;
    let mut r = Reader::new(&bytes[..]);
    r.header().unwrap();
    let e = r.next_record().unwrap_err();
    assert_eq!(e.offset, at as u64);
    assert!(e.to_string().contains("unknown record tag 200"), "{e}");
}

#[test]
fn scan_region_header_then_bytes_equals_the_record() {
    let bytes: Vec<u8> = (0..40).collect();
    let rec =
        Record::ScanRegion { time_ns: 128, kind: region_kind::STACK, addr: 0x7ffd_0000_1000, bytes: bytes.clone() };
    let mut whole = Vec::new();
    Encoder::new().encode(&mut whole, &rec);
    let mut split = Vec::new();
    Encoder::new().scan_region_header(&mut split, 128, region_kind::STACK, 0x7ffd_0000_1000, bytes.len());
    split.extend_from_slice(&bytes);
    assert_eq!(whole, split);
    // And a compressed block framed by compressed_header reads back.
    let mut block = Vec::new();
    let comp = zstd::bulk::compress(&whole, 1).unwrap();
    crate::compressed_header(&mut block, whole.len(), comp.len());
    block.extend_from_slice(&comp);
    let mut with_header = Vec::new();
    encode_header(&mut with_header, &Header { version: VERSION, pointer_size: 8, ..Header::default() });
    let mut plain = with_header.clone();
    Encoder::new().encode(&mut plain, &Record::Thread { tid: 1, time_ns: 0 });
    plain.extend_from_slice(&block);
    let mut r = Reader::new(&plain[..]);
    r.header().unwrap();
    assert!(matches!(r.next_record().unwrap(), Some(Record::Thread { .. })));
    assert_eq!(r.next_record().unwrap(), Some(rec));
}

#[test]
fn a_block_claiming_more_than_the_bound_is_corrupt_at_once() {
    let (plain, _) = sample();
    let mut r = Reader::new(&plain[..]);
    r.header().unwrap();
    let body = r.offset() as usize;
    // A block record claiming 1 GiB of records in 1 GiB, with 60 KiB behind it.
    let mut bad = plain[..body].to_vec();
    bad.push(11);
    crate::varint::put_varint(&mut bad, 1 << 30);
    crate::varint::put_varint(&mut bad, 1 << 30);
    bad.extend(std::iter::repeat_n(0u8, 60 << 10));
    let mut r = Reader::new(&bad[..]);
    r.header().unwrap();
    let e = r.next_record().unwrap_err();
    assert!(matches!(e.kind, ReadErrorKind::Corrupt(_)), "{e}");
    assert_eq!(e.offset, body as u64);
}

#[test]
fn times_read_back_in_whole_units() {
    let mut out = Vec::new();
    encode_header(&mut out, &Header { pointer_size: 8, ..Header::default() });
    let mut e = Encoder::new();
    e.encode(&mut out, &Record::Thread { tid: 1, time_ns: 1000 });
    e.encode(
        &mut out,
        &Record::Alloc { time_ns: 1077, family: Family::Malloc, addr: 0x10, size: 1, stack: 0, align: 0 },
    );
    let mut r = Reader::new(&out[..]);
    assert_eq!(r.header().unwrap().time_shift, crate::TIME_SHIFT);
    assert_eq!(r.next_record().unwrap(), Some(Record::Thread { tid: 1, time_ns: 960 }));
    assert!(matches!(r.next_record().unwrap(), Some(Record::Alloc { time_ns: 1024, .. })));
}

#[test]
fn version_6_streams_still_read() {
    // Version 6: no time unit in the header (ns), heap addresses absolute.
    let mut out = MAGIC.to_vec();
    out.extend([6, 8, 0]); // version, pointer size, little-endian
    out.extend([6]);
    out.extend(b"x86_64");
    out.extend([7, 1, 0, 0, 0, 0]); // pid, ppid, exe "", argc 0, two start times
    out.extend([tag::THREAD, 9, 100]); // tid 9 at 100 ns
    out.extend([tag::ALLOC, 2, 0, 0x90, 0x02, 5, 0]); // +1 ns, malloc, addr 0x110, 5 bytes
    out.extend([tag::FREE, 2, 0, 0x90, 0x02]); // +1 ns, the same address again
    let mut r = Reader::new(&out[..]);
    let h = r.header().unwrap();
    assert_eq!((h.version, h.time_shift), (6, 0));
    assert_eq!(r.next_record().unwrap(), Some(Record::Thread { tid: 9, time_ns: 100 }));
    let alloc = Record::Alloc { time_ns: 101, family: Family::Malloc, addr: 0x110, size: 5, stack: 0, align: 0 };
    assert_eq!(r.next_record().unwrap(), Some(alloc));
    let free = Record::Free { time_ns: 102, family: Family::Malloc, addr: 0x110, stack: 0, align: 0, size: 0 };
    assert_eq!(r.next_record().unwrap(), Some(free));
}

#[test]
fn a_sparse_region_that_does_not_parse_is_corrupt_with_offset() {
    let mut s = Vec::new();
    encode_header(&mut s, &Header { version: VERSION, pointer_size: 8, ..Header::default() });
    let mut enc = Encoder::new();
    enc.encode(&mut s, &Record::Thread { tid: 1, time_ns: 0 });
    // 16 bytes, word 1 held: one varint.
    let mut good = Vec::new();
    crate::sparse::put_len(&mut good, 16);
    good.push(0b10);
    good.push(4);
    let kind = region_kind::MAPPING | region_kind::SPARSE;
    enc.encode(&mut s, &Record::ScanRegion { time_ns: 0, kind, addr: 0x1000, bytes: good.clone() });
    let at = s.len();
    // The bitmap says two words, one varint follows.
    let mut bad = good.clone();
    bad[1] = 0b11;
    enc.encode(&mut s, &Record::ScanRegion { time_ns: 0, kind, addr: 0x2000, bytes: bad });
    let mut r = Reader::new(&s[..]);
    r.header().unwrap();
    assert!(matches!(r.next_record().unwrap(), Some(Record::Thread { .. })));
    assert!(matches!(r.next_record().unwrap(), Some(Record::ScanRegion { addr: 0x1000, .. })));
    let e = r.next_record().unwrap_err();
    assert_eq!(e.offset, at as u64);
    assert!(e.to_string().contains("sparse region has 1 varints for the 2 words its bitmap marks"), "{e}");
}

#[test]
fn allocs_and_frees_of_extreme_values_read_back() {
    let recs = vec![
        Record::Thread { tid: 9, time_ns: 1 << 60 },
        Record::Alloc {
            time_ns: u64::MAX << 6,
            family: Family::Pool,
            addr: u64::MAX,
            size: u64::MAX,
            stack: u32::MAX,
            align: 0,
        },
        Record::Free { time_ns: 0, family: Family::New, addr: 1, stack: u32::MAX, align: 0, size: 0 },
        Record::Free { time_ns: 64, family: Family::Malloc, addr: 1 << 63, stack: 0, align: 0, size: 0 },
        Record::Alloc { time_ns: 128, family: Family::Malloc, addr: 0, size: 0, stack: 0, align: 0 },
    ];
    let mut s = Vec::new();
    encode_header(&mut s, &Header { version: VERSION, pointer_size: 8, ..Header::default() });
    let mut enc = Encoder::new();
    for r in &recs {
        enc.encode(&mut s, r);
    }
    let mut r = Reader::new(&s[..]);
    r.header().unwrap();
    for want in recs {
        assert_eq!(r.next_record().unwrap(), Some(want));
    }
    assert_eq!(r.next_record().unwrap(), None);
}

#[test]
fn many_compressed_blocks_keep_the_buffers_bounded() {
    // Blocks that hardly compress (a region of random bytes each), 10 MiB
    // in all: the bytes read past a block are copied after its contents,
    // so reads as long as the buffer would grow the buffers block by block.
    let (plain, _) = sample();
    let mut r = Reader::new(&plain[..]);
    r.header().unwrap();
    let mut out = plain[..r.offset() as usize].to_vec();
    let mut e = Encoder::new();
    let mut x = 88172645463325252u64;
    const BLOCKS: usize = 40;
    const REGION: usize = 256 << 10;
    for i in 0..BLOCKS {
        let bytes = (0..REGION)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut raw = Vec::new();
        e.encode(&mut raw, &Record::ScanRegion { time_ns: (i as u64 + 1) << 6, kind: 2, addr: 0x1000, bytes });
        crate::encode_compressed(&mut out, &raw, 1).unwrap();
    }
    let mut r = Reader::new(&out[..]);
    r.header().unwrap();
    let (mut n, mut most) = (0, 0);
    while let Some(rec) = r.next_record().unwrap() {
        assert!(matches!(rec, Record::ScanRegion { ref bytes, .. } if bytes.len() == REGION));
        n += 1;
        most = most.max(r.buf.len() + r.spare.len());
    }
    assert_eq!(n, BLOCKS);
    // Each buffer holds at most a block's contents, the bytes read after
    // it and a chunk to read into.
    assert!(most <= 2 * (REGION + 3 * CHUNK), "buffers of {most} bytes");
}
