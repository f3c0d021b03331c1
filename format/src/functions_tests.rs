//! Tests of the functions' tables: lookups by name and version, the
//! prefixed variants, each block's family.

use super::{lookup, Call, INTERPOSED};
use crate::Family;

#[test]
fn names_and_versions() {
    assert_eq!(
        lookup("free@@GLIBC_2.2.5"),
        Some(Call::Free { family: Family::Malloc, args: 1, size: None, align: None })
    );
    assert_eq!(lookup("_dl_debug_state"), Some(Call::LoaderState));
    assert_eq!(lookup("strdup"), None);
    assert_eq!(lookup("_rjem_sdallocx"), Some(Call::Free { family: Family::Malloc, args: 3, size: None, align: None }));
    assert_eq!(lookup("je_mallocx"), Some(Call::Alloc { family: Family::Malloc, size: 0 }));
    assert_eq!(lookup("_rjem_malloc_usable_size"), None);
    assert_eq!(lookup("je_mi_malloc"), None);
    for p in ["_rjem_", "je_"] {
        for n in ["malloc", "calloc", "realloc", "free", "posix_memalign", "aligned_alloc"] {
            assert_eq!(lookup(&format!("{p}{n}")), lookup(n), "{p}{n}");
        }
        for n in ["mallocx", "rallocx", "sdallocx", "dallocx"] {
            assert_eq!(lookup(&format!("{p}{n}")), lookup(n), "{p}{n}");
        }
    }
    assert_eq!(lookup("mi_free_size"), Some(Call::Free { family: Family::Malloc, args: 2, size: None, align: None }));
    assert_eq!(lookup("mi_malloc_aligned"), Some(Call::Alloc { family: Family::Malloc, size: 0 }));
    assert_eq!(lookup("tc_memalign"), Some(Call::Alloc { family: Family::Aligned, size: 1 }));
    assert_eq!(
        lookup("free_aligned_sized"),
        Some(Call::Free { family: Family::Malloc, args: 3, size: Some(2), align: None })
    );
    assert_eq!(
        lookup("_ZdaPvmSt11align_val_t"),
        Some(Call::Free { family: Family::NewArray, args: 3, size: Some(1), align: Some(2) })
    );
    assert_eq!(lookup("_ZnwmSt11align_val_tRKSt9nothrow_t"), Some(Call::New { family: Family::New, align: Some(1) }));
    assert!(super::ENTRY_POINTS.len() >= 50);
    assert_eq!(super::prefixes_of("jemalloc"), ["_rjem_", "je_"]);
    assert_eq!(super::prefixes_of("tcmalloc"), ["tc_"]);
    assert_eq!(super::prefixes_of("c23"), Vec::<&str>::new());
    let mut names: Vec<&str> = INTERPOSED.iter().map(|(n, _)| *n).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), INTERPOSED.len(), "a name twice");
    let mut all: Vec<&str> = INTERPOSED.iter().chain(super::ENTRY_POINTS).map(|(n, _)| *n).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), INTERPOSED.len() + super::ENTRY_POINTS.len(), "a name in both tables");
}

#[test]
fn each_blocks_family() {
    let family = |n: &str| lookup(n).and_then(Call::family);
    assert_eq!(family("calloc"), Some(Family::Malloc));
    assert_eq!(family("reallocarray"), Some(Family::Malloc));
    assert_eq!(family("posix_memalign"), Some(Family::Aligned));
    assert_eq!(family("pvalloc"), Some(Family::Aligned));
    assert_eq!(family("_ZdaPvm"), Some(Family::NewArray));
    assert_eq!(family("mmap"), None);
    assert_eq!(super::interposed_family("valloc"), Family::Aligned);
}
