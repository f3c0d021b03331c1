//! tikv-jemallocator as the global allocator: jemalloc linked in, its API
//! under the `_rjem_` prefix (`_rjem_malloc`, `_rjem_sdallocx`).

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    rust_allocators::run("rust_jemalloc");
}
