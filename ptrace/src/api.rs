//! mtrace's C API (include/mtrace.h) under ptrace, where no libmtrace.so
//! defines it.
//!
//! A program refers to the API weakly, so without the preload each
//! reference is NULL and its `MTRACE(...)` calls do nothing. The tracer
//! gives each function a stub of its own: a scratch slot holding only a
//! breakpoint. It writes the stub's address into every GOT slot the loader
//! fills for a reference to the function (GLOB_DAT for the address
//! `MTRACE()` tests, JUMP_SLOT for a direct call). The program's call then
//! stops at the stub; the tracer does what the preload's function does
//! (tracer/api.rs), sets the result and returns to the caller.
//!
//! When: the loader fills a module's slots when it relocates it (NULL for
//! an undefined weak symbol), which may come after the tracer's first look
//! at the module. So the slots are written after each change of the module
//! list and again at the next entry of an interposed function, by which
//! time the program's own modules are relocated (`Process::api_pending`).
//! Not for a static program: its linker resolved the references to 0 in
//! the code itself.

use nix::unistd::Pid;

use crate::arch;
use crate::funcs::Api;
use crate::process::Process;
use crate::target;

impl Process {
    /// The function whose stub is at `addr`, if one is.
    pub fn api_at(&self, addr: u64) -> Option<Api> {
        self.api.iter().find(|(_, at)| *at == addr).map(|&(a, _)| a)
    }

    /// The stub of `api`, made on first use; `None` when no scratch slot
    /// could be had.
    fn api_stub(&mut self, tid: Pid, api: Api, signals: &mut Vec<nix::sys::signal::Signal>) -> Option<u64> {
        if let Some(&(_, at)) = self.api.iter().find(|(a, _)| *a == api) {
            return Some(at);
        }
        let near = self.modules.first().map_or(0, |m| m.range.0);
        let at = self.slot(tid, near, signals).ok()?;
        target::poke(tid, at, &arch::BREAKPOINT).ok()?;
        self.api.push((api, at));
        Some(at)
    }

    /// Points every GOT slot of a reference to the API at its stub
    /// (stopped thread `tid`), and asks for another look at the next entry
    /// of an interposed function.
    pub fn patch_api(&mut self, tid: Pid, signals: &mut Vec<nix::sys::signal::Signal>) {
        let slots: Vec<(u64, Api)> = self.modules.iter().flat_map(|m| m.api_slots.iter().copied()).collect();
        for (slot, api) in slots {
            let Some(stub) = self.api_stub(tid, api, signals) else { continue };
            if target::read_u64(self.pid, slot) != Some(stub) {
                // PTRACE_POKEDATA writes a read-only page too (RELRO).
                if let Err(e) = target::poke(tid, slot, &stub.to_le_bytes()) {
                    eprintln!("mtrace: the C API's reference at {slot:#x} cannot be written: {e:#}");
                }
            }
        }
        self.api_pending = true;
    }

    /// At an interposed function's entry (stopped thread `tid`): the GOT
    /// slots written once more, after the loader relocated them.
    pub fn patch_api_after_relocation(&mut self, tid: Pid) {
        if self.api_pending {
            let mut signals = Vec::new();
            self.patch_api(tid, &mut signals);
            self.api_pending = false;
        }
    }

    /// The id of pool `name` in this stream, defined in it on first use.
    pub fn pool_id(&mut self, tid: u32, name: &str) -> u32 {
        if let Some(i) = self.pools.iter().position(|p| p == name) {
            return i as u32 + 1;
        }
        self.pools.push(name.to_owned());
        let id = self.pools.len() as u32;
        self.stream.record(tid, &mtrace_format::Record::PoolName { id, name: name.to_owned() });
        id
    }
}

/// The NUL-terminated string at `addr` in process `pid` (at most 4 KiB;
/// `None` for NULL or unreadable memory).
pub fn read_string(pid: Pid, addr: u64) -> Option<String> {
    if addr == 0 {
        return None;
    }
    let mut out = Vec::new();
    let mut chunk = [0u8; 256];
    while out.len() < 4096 {
        let n = target::read(pid, addr + out.len() as u64, &mut chunk);
        if n == 0 {
            break;
        }
        match chunk[..n].iter().position(|&b| b == 0) {
            Some(end) => {
                out.extend_from_slice(&chunk[..end]);
                return Some(String::from_utf8_lossy(&out).into_owned());
            }
            None => out.extend_from_slice(&chunk[..n]),
        }
    }
    (!out.is_empty()).then(|| String::from_utf8_lossy(&out).into_owned())
}
