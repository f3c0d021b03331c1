//! An allocator defined in the executable (Chromium's PartitionAlloc shim,
//! a program linked with `libtcmalloc_minimal.a`, Rust's tikv-jemallocator
//! with its `_rjem_` names): the loader looks in the executable before any
//! preload, so the program's calls never reach the hooks by name. Each
//! allocation function the executable defines (targets.rs) is hooked by
//! patching its entry (platform/patch.rs); its hook then calls the
//! original. What was hooked and what was left alone, with why, goes into
//! every stream of the process ([`mtrace_format::Record::Patched`]); the
//! analyzer's report names the allocator as seen, or says what it could
//! not see.
//!
//! In two steps: [`prepare`] finds the functions, moves their first
//! instructions into trampolines and points the hooks at those originals
//! (a hook calling one runs the function as it was), with the loader and
//! the tracer's heap; [`write`] writes the jumps, with no other thread
//! running code they replace, and nothing else. From the preload's
//! constructor both at once ([`executable`]); under `mtrace attach`, the
//! first in `mtrace_attach_init` while the program runs, the second in
//! [`mtrace_attach_patch`] while the attacher holds every other thread
//! (which may hold the loader's lock or the tracer's), and
//! [`mtrace_attach_patched`] writes the record once they run again. The
//! detach puts the functions back ([`undo`]).
//!
//! Functions at one address (tcmalloc's `malloc` is its `tc_malloc`) are
//! patched once: with the hook of the first name in
//! `mtrace_format::functions`' order, every name's original set. A free
//! that is also an `operator delete` gets a shared free's hook
//! (hooks/shared_free.rs).

mod targets;

use mtrace_format::Record;
use parking_lot::Mutex;

use crate::platform::patch::{self, Site, Trampolines};
use crate::platform::sys;
use crate::snapshot::stop;
use targets::Target;

/// Functions ready for their jumps: trampolines sealed, originals set.
#[derive(Clone)]
struct Prepared {
    path: String,
    bias: u64,
    phdrs: Vec<libc::Elf64_Phdr>,
    /// Each site with its function's names.
    sites: Vec<(Site, Vec<String>)>,
    /// Functions left alone already: (name, why).
    refused: Vec<(String, String)>,
}

/// Sites whose jumps are written, for [`undo`].
static WRITTEN: Mutex<Vec<(Site, u64, Vec<libc::Elf64_Phdr>)>> = Mutex::new(Vec::new());

/// From the constructor of a preloaded library: hooks the allocation
/// functions the executable defines, and writes what it did into the
/// stream `s`. Nothing when the executable defines none (the common case:
/// glibc's malloc, interposed by name).
pub fn executable(s: &crate::stream::Session) {
    let Some(p) = prepare() else { return };
    if !p.sites.is_empty() {
        // Blocks its allocator made before the jumps were not seen: their
        // frees are no wrong frees. Said before the first hook can run
        // (another thread may call it the moment its jump is written).
        let collecting = crate::record::recorder::collecting();
        s.write_now(|time_ns| Record::Coverage { time_ns, collecting, whole: false });
    }
    let rec = write(p, Others::HoldHere);
    announce(s, rec);
}

/// Writes `rec` into the stream `s` now, and keeps it for the streams of
/// the process that start later (a fork's child).
fn announce(s: &crate::stream::Session, rec: Record) {
    let stamped = rec.clone();
    s.write_now(move |time_ns| match stamped {
        Record::Patched { patch, .. } => Record::Patched { time_ns, patch },
        other => other,
    });
    patch::remember(rec);
}

/// What [`prepare`] made, kept: its trampolines stay mapped and its
/// shared frees' slots taken, and a later `mtrace attach` (after a
/// detach) writes the same jumps again.
static MADE: Mutex<Option<Option<Prepared>>> = Mutex::new(None);

/// Finds the executable's allocation functions and prepares each (see the
/// module's comment), once per process image; `None` when there is
/// nothing to patch.
fn prepare() -> Option<Prepared> {
    MADE.lock().get_or_insert_with(prepare_now).clone()
}

/// [`prepare`], the first time.
fn prepare_now() -> Option<Prepared> {
    let path = sys::readlink(c"/proc/self/exe")?;
    let (bias, phdrs) = targets::executable_module()?;
    let found = targets::in_executable(bias)?;
    if found.is_empty() {
        return None;
    }
    let mut p = Prepared { path, bias, phdrs, sites: Vec::new(), refused: Vec::new() };
    let (lo, hi) = targets::span(bias, &p.phdrs);
    let Some(mut tramp) = Trampolines::near(lo, hi) else {
        for t in &found {
            refuse(&mut p.refused, &t.names, "no free memory near the executable for its trampolines");
        }
        return Some(p);
    };
    let own = targets::own_hooks();
    for t in &found {
        // SAFETY: the symbol's bytes are the executable's mapped code.
        let placed = unsafe { patch::displace(t.entry, t.size) }.and_then(|d| place(&mut tramp, &d, t, &own));
        match placed {
            Ok(site) => p.sites.push((site, t.names.clone())),
            Err(why) => refuse(&mut p.refused, &t.names, &why),
        }
    }
    if !tramp.seal() {
        for (_, names) in std::mem::take(&mut p.sites) {
            refuse(&mut p.refused, &names, "its trampolines could not be made executable");
        }
        return Some(p);
    }
    // Before any jump: a hook may run as soon as its jump is written.
    for (site, names) in &p.sites {
        for n in names {
            targets::set_original(n, site.original as usize);
        }
    }
    Some(p)
}

/// Adds `names`, all left alone for `why`, to `refused`.
fn refuse(refused: &mut Vec<(String, String)>, names: &[String], why: &str) {
    refused.extend(names.iter().map(|n| (n.clone(), why.to_owned())));
}

/// Where the program's other threads are while the jumps are written.
enum Others<'a> {
    /// There are none, or they are held from here, as for the leak scan
    /// (the preload's constructor: another library's may have started one).
    HoldHere,
    /// `mtrace attach` holds them, at these instruction pointers
    /// (`u64::MAX`: one it could not hold).
    HeldAt(&'a [u64]),
}

/// Writes the jumps of `p`'s sites, but of a site another thread is inside;
/// the record of what was done. With other threads held, the tracer's
/// heap is held first (a held thread may be inside a hook, allocating):
/// nothing else a held thread may hold is taken.
fn write(p: Prepared, others: Others) -> Record {
    let Prepared { path, bias, phdrs, sites, mut refused } = p;
    let prot = |page: u64| targets::prot_of(page, &phdrs, bias);
    let me = sys::gettid() as i32;
    let alone = || sys::numbered_entries(c"/proc/self/task").iter().all(|&t| t == me);
    let mut heap = None;
    let held = match others {
        Others::HeldAt(ips) => Ok((None, ips.to_vec())),
        Others::HoldHere if alone() => Ok((None, Vec::new())),
        Others::HoldHere => {
            heap = crate::platform::allocator::hold(true);
            match stop::from_outside(&[me]) {
                Ok(h) if h.missed.is_empty() && heap.is_some() => {
                    let ips = h.parked().iter().filter_map(|p| p.regs().get(16).copied()).collect();
                    Ok((Some(h), ips))
                }
                Ok(_) => Err("another thread could not be held".to_owned()),
                Err(why) => Err(format!("other threads could not be held: {why}")),
            }
        }
    };
    let (holding, ips) = match held {
        Ok(h) => h,
        Err(why) => {
            for (_, names) in &sites {
                refuse(&mut refused, names, &why);
            }
            return finish(path, Vec::new(), refused);
        }
    };
    let unknown = ips.contains(&u64::MAX);
    let busy = |s: &Site| ips.iter().any(|&ip| ip > s.entry && ip < s.entry + s.len as u64);
    let mut hooked = Vec::new();
    let free: Vec<&(Site, Vec<String>)> = sites
        .iter()
        .filter(|(s, names)| {
            let why = match (unknown, busy(s)) {
                (true, _) => "a thread could not be held while it was written",
                (false, true) => "a thread was inside its first bytes",
                (false, false) => return true,
            };
            refuse(&mut refused, names, why);
            false
        })
        .collect();
    let plain: Vec<Site> = free.iter().map(|(s, _)| *s).collect();
    // SAFETY: every other thread is held (or there is none), none inside
    // a site written; the sites come from a sealed mapping.
    let done = unsafe { patch::write_jumps(&plain, prot) };
    drop(holding);
    drop(heap);
    let mut written = WRITTEN.lock();
    for ((site, names), r) in free.into_iter().zip(done) {
        match r {
            Ok(()) => {
                hooked.extend(names.iter().cloned());
                written.push((*site, bias, phdrs.clone()));
            }
            Err(why) => refuse(&mut refused, names, &why),
        }
    }
    finish(path, hooked, refused)
}

/// The record of what was patched in the module at `path`, names in the
/// tables' order, at time 0.
fn finish(path: String, mut hooked: Vec<String>, mut refused: Vec<(String, String)>) -> Record {
    hooked.sort_by_key(|n| targets::order(n));
    refused.sort_by_key(|(n, _)| targets::order(n));
    Record::Patched { time_ns: 0, patch: Box::new(mtrace_format::Patch { path, hooked, refused }) }
}

/// The thunk and moved instructions of `t`'s entry, jumping to its hook.
fn place(
    tramp: &mut Trampolines,
    d: &patch::Displaced,
    t: &Target,
    own: &std::collections::BTreeMap<String, u64>,
) -> Result<Site, String> {
    let first = &t.names[0];
    let shared = targets::shared_free(&t.names);
    // A shared free's hook needs its original's address before the
    // thunk: placed with a stand-in, the hook taken, the thunk rewritten.
    let hook = match shared {
        Some(_) => 0,
        None => targets::hook_of(first, own).ok_or_else(|| format!("no hook for {first}"))?,
    };
    let site = tramp.add(d, hook)?;
    if let Some(args) = shared {
        use crate::platform::hook_addresses as hooks;
        hooks::shared_free(args, 0).ok_or("no hook for a shared free")?;
        let slot = hooks::claim_shared_free(site.original as usize).ok_or("no slot left for another shared free")?;
        let hook = hooks::shared_free(args, slot).ok_or("no hook for a shared free")? as u64;
        tramp.set_thunk(&site, hook);
    }
    Ok(site)
}

/// What `mtrace attach` prepared, until its [`mtrace_attach_patch`].
static PREPARED: Mutex<Option<Prepared>> = Mutex::new(None);
/// What [`mtrace_attach_patch`] did, until [`mtrace_attach_patched`].
static PENDING: Mutex<Option<Record>> = Mutex::new(None);

/// [`mtrace_attach_patch`] found the tracer's heap held (by a thread the
/// attach stopped): nothing was written.
static HEAP_HELD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From `mtrace_attach_init`, while the program runs: prepares the
/// executable's allocation functions for [`mtrace_attach_patch`].
pub fn prepare_attached() {
    *PREPARED.lock() = prepare();
}

/// Called by `mtrace attach` with every other thread of the process held,
/// `ips` (`n` words) where each one is (`u64::MAX`: one not held): writes
/// the jumps [`prepare_attached`] prepared. Returns how many functions
/// were hooked.
///
/// # Safety
/// `ips` points to `n` words.
#[no_mangle]
pub unsafe extern "C" fn mtrace_attach_patch(ips: *const u64, n: usize) -> i32 {
    let _g = crate::record::guard::Guard::enter();
    // SAFETY: per the contract.
    let ips = if ips.is_null() { &[][..] } else { unsafe { std::slice::from_raw_parts(ips, n) } };
    if PREPARED.lock().is_none() {
        return 0;
    }
    // Before any allocation: a stopped thread may be inside a hook,
    // holding the tracer's heap (then nothing is written).
    let Some(heap) = crate::platform::allocator::hold(false) else {
        HEAP_HELD.store(true, std::sync::atomic::Ordering::Release);
        return 0;
    };
    let Some(p) = PREPARED.lock().take() else { return 0 };
    let rec = write(p, Others::HeldAt(ips));
    drop(heap);
    let hooked = match &rec {
        Record::Patched { patch, .. } => patch.hooked.len() as i32,
        _ => 0,
    };
    *PENDING.lock() = Some(rec);
    hooked
}

/// Called by `mtrace attach` once the threads run again: what
/// [`mtrace_attach_patch`] did goes into the stream. Returns 0.
#[no_mangle]
pub extern "C" fn mtrace_attach_patched() -> i32 {
    let _g = crate::record::guard::Guard::enter();
    let mut rec = PENDING.lock().take();
    if HEAP_HELD.swap(false, std::sync::atomic::Ordering::AcqRel) {
        if let Some(p) = PREPARED.lock().take() {
            let mut refused = p.refused;
            for (_, names) in &p.sites {
                refuse(&mut refused, names, "a thread the attach held was inside the tracer");
            }
            rec = Some(finish(p.path, Vec::new(), refused));
        }
    }
    if let (Some(rec), Some(s)) = (rec, crate::stream::current()) {
        announce(s, rec);
    }
    0
}

/// `mtrace attach`'s detach: the patched functions' first bytes are put
/// back, with the other threads held as for the leak scan (a thread inside
/// a hook or a moved prologue goes on: both stay mapped). Where they
/// cannot be held, the jumps stay, and their hooks forward untraced.
pub fn undo() {
    let written = std::mem::take(&mut *WRITTEN.lock());
    patch::forget();
    if written.is_empty() {
        return;
    }
    let me = sys::gettid() as i32;
    let held = match stop::from_outside(&[me]) {
        Ok(h) if h.missed.is_empty() => h,
        _ => {
            WRITTEN.lock().extend(written);
            return;
        }
    };
    for (site, bias, phdrs) in &written {
        // SAFETY: every other thread is held.
        let _ = unsafe { patch::restore(std::slice::from_ref(site), |page| targets::prot_of(page, phdrs, *bias)) };
    }
    drop(held);
}
