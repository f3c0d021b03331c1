//! What the session's commands and report points write into the stream:
//! a Marker, a record after everything buffered, the end of a detach.

use mtrace_format::{Encoder, EndReason, Record};

use super::Session;
use crate::platform::sys;

impl Session {
    /// Reads the command bytes that arrived from the socket's reader into
    /// `pending` (nothing on a file: its commands come by no channel);
    /// false once the reader closed the connection or the stream was lost.
    pub fn receive_commands(&self, pending: &mut Vec<u8>) -> bool {
        self.out.receive(pending)
    }

    /// Writes a Marker record after everything buffered so far.
    pub fn marker(&self, seq: u64, name: &str) {
        self.write_now(|time_ns| Record::Marker { time_ns, seq, name: name.to_owned() });
    }

    /// Writes report point `seq`'s Marker after a Report to record that
    /// sends its report to `path` (a socket stream's reader makes it).
    pub fn marker_to(&self, seq: u64, name: &str, path: String) {
        self.write_all_now(|time_ns| {
            [Record::ReportTo { time_ns, seq, path }, Record::Marker { time_ns, seq, name: name.to_owned() }]
        });
    }

    /// Writes the record `make` builds from the time now after everything
    /// the threads buffered so far.
    pub fn write_now(&self, make: impl FnOnce(u64) -> Record) {
        self.write_all_now(|now| [make(now)]);
    }

    /// [`Session::write_now`] of the records `make` builds, in their order.
    fn write_all_now<const N: usize>(&self, make: impl FnOnce(u64) -> [Record; N]) {
        let _f = self.file.lock();
        self.collect(false);
        let now = self.now();
        let mut buf = Vec::with_capacity(128);
        let mut enc = Encoder::new();
        enc.encode(&mut buf, &Record::Thread { tid: sys::gettid(), time_ns: now });
        for r in make(now) {
            enc.encode(&mut buf, &r);
        }
        self.write_unordered(&buf);
    }

    /// Ends the stream while the program goes on (a detach, after the
    /// session undid `mtrace attach`'s redirections): everything buffered
    /// and an End record (reason detach) are written, the stream is
    /// closed.
    pub fn end_detached(&self) {
        self.final_flush(EndReason::Detach, false, None);
        super::stop_tracing(false);
        self.out.close();
        // The process's descriptors are its own again.
        sys::close_statm();
    }
}
