//! The mimalloc crate as the global allocator: mimalloc linked in, its API
//! as `mi_*` (`mi_malloc_aligned`, `mi_free`).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    rust_allocators::run("rust_mimalloc");
}
