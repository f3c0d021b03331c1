//! The stream decoder on any bytes: a header, then records until the end
//! or the first error; never a panic, never an unbounded allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut r = mtrace_format::Reader::new(data);
    if r.header().is_err() {
        return;
    }
    while let Ok(Some(_)) = r.next_record() {}
});
