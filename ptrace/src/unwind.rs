//! Backtraces of a stopped thread, unwound by the tracer with framehop
//! from the modules' .eh_frame (complete for code without frame pointers)
//! over stack memory read from outside (one process_vm_readv of the top of
//! the stack, more only if the walk goes past it).

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use nix::unistd::Pid;

use crate::modules::{Bytes, Loaded};
use crate::target::{self, Stack};

/// Stack bytes read at once from the stack pointer up.
const CHUNK: usize = 16 << 10;

/// A process's unwinder: its modules' unwind tables and framehop's cache.
pub struct Unwind {
    unwinder: UnwinderX86_64<Bytes>,
    cache: CacheX86_64,
    stack: Vec<u8>,
}

impl Default for Unwind {
    fn default() -> Unwind {
        Unwind { unwinder: UnwinderX86_64::new(), cache: CacheX86_64::new(), stack: vec![0; CHUNK] }
    }
}

impl Unwind {
    /// Adds a loaded module's unwind tables.
    pub fn add(&mut self, l: &Loaded) {
        let bias = l.module.bias;
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: l.text.map(|(a, n)| a..a + n),
            eh_frame_hdr_svma: l.eh_frame_hdr.as_ref().map(|(a, d)| *a..*a + d.len() as u64),
            eh_frame_hdr: l.eh_frame_hdr.as_ref().map(|(_, d)| d.clone()),
            eh_frame_svma: l.eh_frame.as_ref().map(|(a, d)| *a..*a + d.len() as u64),
            eh_frame: l.eh_frame.as_ref().map(|(_, d)| d.clone()),
            ..Default::default()
        };
        let m = Module::new(l.module.path.clone(), l.range.0..l.range.1, bias, info);
        self.unwinder.add_module(m);
    }

    /// Removes the module mapped from `start`.
    pub fn remove(&mut self, start: u64) {
        self.unwinder.remove_module(start);
    }

    /// Appends to `out` the return addresses above a function's caller
    /// frame (ip, sp, bp), the caller's own `ip` first, up to `depth`
    /// frames, reading `pid`'s stack (or only the copy a uprobe took).
    pub fn walk(&mut self, pid: Pid, (ip, sp, bp): (u64, u64, u64), from: Stack, depth: usize, out: &mut Vec<u64>) {
        // A live stack: its top read at once, the rest word by word.
        let (copy, live) = match from {
            Stack::Live => {
                let got = target::read(pid, sp, &mut self.stack);
                (Stack::Copy { base: sp, bytes: &self.stack[..got] }, true)
            }
            copy => (copy, false),
        };
        let mut read = |addr: u64| -> Result<u64, ()> {
            copy.read_u64(pid, addr).or_else(|| live.then(|| target::read_u64(pid, addr)).flatten()).ok_or(())
        };
        let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
        out.push(ip);
        let mut address = FrameAddress::from_return_address(ip);
        while out.len() < depth {
            let Some(a) = address else { break };
            match self.unwinder.unwind_frame(a, &mut regs, &mut self.cache, &mut read) {
                Ok(Some(ret)) if ret != 0 => {
                    out.push(ret);
                    address = FrameAddress::from_return_address(ret);
                }
                _ => break,
            }
        }
    }
}
