//! The mtrace stream format, defined once for every producer (the preload,
//! the ptrace tracer) and for the analyzer, with the socket address syntax
//! ([`address`]) and the commands and marker names ([`protocol`]) they
//! share, and the rule both producers follow when they let a thread they
//! stopped go on ([`interrupted`]).
//!
//! A stream is a [`Header`] followed by [`Record`]s. Every integer after the
//! 8-byte magic is an unsigned LEB128 varint, so the stream reads the same on
//! hosts of either byte order. `docs/FORMAT.md` describes the bytes in prose
//! for readers written in other languages.

pub mod address;
mod decode;
mod encode;
pub mod functions;
pub mod interrupted;
pub mod maps;
pub mod naming;
pub mod protocol;
pub mod realloc;
mod record;
pub mod recording;
pub mod sampling;
pub mod settings;
pub mod sparse;
mod varint;

pub use decode::{ReadError, ReadErrorKind, Reader};
pub use encode::{compressed_header, encode_compressed, encode_header, Encoder};
pub use record::{region_kind, EndReason, Family, Header, Module, Patch, Record, Segment, StackSum};
pub use varint::{put_varint, put_varint_at, unzigzag, zigzag};

/// First 8 bytes of every stream: `MTRACE`, a NUL, and 0x1a (the byte that
/// stops a text `type` on some systems), so a text tool sees a binary file.
pub const MAGIC: [u8; 8] = *b"MTRACE\0\x1a";

/// Format version written in the header. Readers reject newer versions.
pub const VERSION: u64 = 14;

/// Writers of this version record times in units of 2^TIME_SHIFT ns (64
/// ns; the header says which unit a stream uses). Finer than anything a
/// report shows, and well inside the 250 ns the books allow between
/// threads' stamps; the low bits of a ns clock are noise zstd cannot
/// compress: jq's trace went from 1.14 to 0.40 bytes per event with it.
pub const TIME_SHIFT: u8 = 6;

/// The most bytes of records a compressed block may hold (16 MiB): writers
/// split larger batches, readers reject larger claims as corrupt, so that a
/// damaged length cannot make a reader allocate gigabytes.
pub const MAX_BLOCK_RAW: usize = 16 << 20;
