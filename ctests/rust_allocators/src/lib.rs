//! What both programs do, each with its own global allocator: 10 blocks
//! of 100 bytes forgotten (the line marked `@leak:forgotten`), 1,000
//! strings made and dropped, and one line of output.

/// Forgets one block of 100 bytes. Its address escapes (`black_box`):
/// otherwise the compiler may leave out an allocation nothing reads.
#[inline(never)]
pub fn forget_one(i: u8) {
    std::hint::black_box(Box::leak(Box::new([i; 100]))); // @leak:forgotten
}

/// The work, then `NAME: done` on stdout.
pub fn run(name: &str) {
    for i in 0..10 {
        forget_one(std::hint::black_box(i));
    }
    let strings: Vec<String> = (0..1000).map(|i| format!("{i}")).collect();
    drop(std::hint::black_box(strings));
    println!("{name}: done");
}
