//! Streams that arrive: the one listener every command binds
//! ([`listen::Listener`]) and the keepers of what arrives on it
//! ([`keepers::Keepers`]).

pub mod keepers;
pub mod listen;
