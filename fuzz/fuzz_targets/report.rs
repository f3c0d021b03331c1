//! The report of any bytes read as a trace: the books, the leak scan when
//! the bytes hold a snapshot, and the text and JSON reports (without
//! symbolization).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mtrace_analyzer::{load, report, symbolize};

fuzz_target!(|data: &[u8]| {
    let Ok(t) = load::load_from(data, std::path::Path::new("fuzz.mtrace"), &load::Window::default()) else {
        return;
    };
    // No frames symbolized (depth 0): the seeds' modules are the machine's
    // libraries, and reading their debug info took 0.2 s a run. The
    // symbolizer is left to the end-to-end tests.
    let mut sym = symbolize::Symbolizer::new(symbolize::SearchPaths::default());
    let r = report::build(&t, &mut sym, report::SortKey::Bytes, Some(0), true);
    let _ = report::write_text(&r, &mut std::io::sink());
    let _ = serde_json::to_writer(std::io::sink(), &r);
});
