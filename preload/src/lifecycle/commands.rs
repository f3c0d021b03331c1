//! What each command from a socket's reader does (the closed set
//! `mtrace_format::protocol::Command`, matched here only). The writer
//! thread reads and parses the lines (stream/control.rs) and hands each
//! command here through [`crate::Up::command`]: carrying them out takes
//! the rooms above the stream (the recorder's switch, the snapshot,
//! attach's redirections).

use mtrace_format::protocol::{marker, Command};

use crate::record::recorder;
use crate::snapshot;
use crate::stream::Session;

/// Carries out `c` on session `s` (by the writer thread, or the program's
/// thread in a solo process); false when it
/// ended tracing (`detach`).
pub fn carry_out(s: &Session, c: Command) -> bool {
    match c {
        Command::Start => recorder::set_collecting(true),
        Command::Stop => recorder::set_collecting(false),
        Command::Depth(d) => s.set_depth(d),
        Command::Marker(name) => s.marker(0, &name),
        Command::Scan => {
            snapshot::take(s, snapshot::By::asked(s));
            s.marker(0, marker::SCAN);
        }
        Command::Detach => {
            s.detach();
            return false;
        }
    }
    true
}
