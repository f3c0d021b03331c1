fn main() {
    println!("cargo:rerun-if-changed=src/exec_shim.c");
    cc::Build::new().file("src/exec_shim.c").warnings(true).compile("mtrace_exec_shim");
}
