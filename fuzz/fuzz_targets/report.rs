//! The report of any bytes read as a trace: the books, the leak scan when
//! the bytes hold a snapshot, and the text and JSON reports (without
//! symbolization), through the same pipeline as `mtrace report`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mtrace_analysis::output::{self, Format};
use mtrace_analysis::{input, pipeline, report, symbolize, trace};

fuzz_target!(|data: &[u8]| {
    let Ok(t) = input::load_from(data, std::path::Path::new("fuzz.mtrace"), &trace::Window::default()) else {
        return;
    };
    // No frames symbolized (depth 0): the seeds' modules are the machine's
    // libraries, and reading their debug info took 0.2 s a run. The
    // symbolizer is left to the end-to-end tests.
    let mut sym = symbolize::Symbolizer::new(symbolize::SearchPaths::default());
    let mut r = pipeline::build(&t, &mut sym, report::SortKey::Bytes, Some(0), true, report::View::default());
    let style = output::Style { depth: Some(0), ..Default::default() };
    let mut src = output::Sources { trace: &t, report: Some(&mut r), classes: None };
    for f in [Format::Text, Format::Json, Format::Folded, Format::Pprof] {
        let _ = output::write(f, &mut src, &mut sym, &style, &mut std::io::sink());
    }
});
