//! Builds the exec shim and the static-TLS anchor (C) into libmtrace.so
//! and links the library with every symbol bound at load time.

fn main() {
    println!("cargo:rerun-if-changed=src/exec_shim.c");
    println!("cargo:rerun-if-changed=src/static_tls.c");
    // Resolve every symbol at load time: a lazy PLT fix-up in the writer
    // thread would take the dynamic loader's locks at an arbitrary moment.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,now");
    cc::Build::new().file("src/exec_shim.c").file("src/static_tls.c").warnings(true).compile("mtrace_exec_shim");
}
