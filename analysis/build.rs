//! Compiles pprof's profile.proto (proto/, vendored from github.com/google/pprof)
//! into the Rust types of `output::pprof`, without protoc.

fn main() {
    println!("cargo:rerun-if-changed=proto/profile.proto");
    let fds = match protox::compile(["profile.proto"], ["proto"]) {
        Ok(f) => f,
        Err(e) => panic!("proto/profile.proto: {e}"),
    };
    if let Err(e) = prost_build::Config::new().compile_fds(fds) {
        panic!("proto/profile.proto: {e}");
    }
}
