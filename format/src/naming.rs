//! How producers name their trace files (`docs/FORMAT.md`, "Files"): one
//! rule for libmtrace.so and the ptrace tracer, so that `%e` and `%%` mean
//! the same under both.

/// The arguments in the bytes of a `/proc/PID/cmdline` (each ended by a
/// NUL; empty arguments kept, invalid UTF-8 replaced with U+FFFD). A
/// process title a program wrote over its arguments (setproctitle's way:
/// redis-server's `redis-server *:6379`, nginx's `nginx: master process
/// …`, postgres's), the title in the first and the rest of the area
/// zeroed, is that one argument, not it and a run of empty ones.
pub fn cmdline_args(bytes: &[u8]) -> Vec<String> {
    if bytes.is_empty() {
        return Vec::new();
    }
    // Each argument ends with a NUL; an empty one is an argument too.
    let args = bytes.strip_suffix(&[0]).unwrap_or(bytes);
    let mut v: Vec<String> = args.split(|&b| b == 0).map(|s| String::from_utf8_lossy(s).into_owned()).collect();
    if v.len() > 1 && v[0].contains(' ') && v[1..].iter().all(String::is_empty) {
        v.truncate(1);
    }
    v
}

/// The most bytes of a program name in a file name: the file's whole
/// name must stay within NAME_MAX (255) with the pid and the suffixes.
pub const MAX_PROGRAM_NAME: usize = 64;

/// The program name of a file name: argv[0]'s last path component, or
/// `program` when there is none. Of a process title ([`cmdline_args`]'s
/// one argument with spaces), its first word: Chromium's zygote children
/// write their whole command line into argv[0] (`/usr/lib/chromium/chromium
/// --type=zygote … --user-data-dir=/tmp/…`), whose last component was a
/// 200-byte name with spaces; `redis-server *:6379` is `redis-server`,
/// `nginx: master process …` `nginx`. At most [`MAX_PROGRAM_NAME`] bytes,
/// without control characters. An argv[0] of `/proc/self/exe` (or
/// `/proc/PID/exe`: Chromium starts its utility processes so) names the
/// program by `exe`, the file the process runs, where given.
pub fn program_name(cmdline: &[String], exe: &str) -> String {
    let mut a0 = cmdline.first().map(String::as_str).unwrap_or("");
    if cmdline.len() == 1 {
        a0 = a0.split(' ').next().unwrap_or("");
    }
    let proc_exe = a0.strip_prefix("/proc/").and_then(|r| r.strip_suffix("/exe")).is_some_and(|p| !p.contains('/'));
    if proc_exe && !exe.is_empty() {
        a0 = exe;
    }
    let base = a0.rsplit('/').next().unwrap_or("").trim_end_matches(':');
    let mut name: String = base.chars().filter(|c| !c.is_control()).collect();
    if name.len() > MAX_PROGRAM_NAME {
        let mut end = MAX_PROGRAM_NAME;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
    }
    if name.is_empty() {
        name = "program".into();
    }
    name
}

/// Output pattern `pattern` with `%p` the pid, `%e` the program name and
/// `%%` a percent sign; any other `%` stays as written.
pub fn expand(pattern: &str, pid: u32, prog: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('p') => out.push_str(&pid.to_string()),
            Some('e') => out.push_str(prog),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o)
            }
            None => out.push('%'),
        }
    }
    out
}

/// The most numeric suffixes a producer tries for a taken name.
pub const MAX_SUFFIX: u32 = 999;

/// The names a producer tries for a trace whose name is `base`, in order:
/// `base`, then `base.1` to `base.999` (an exec keeps the pid, and the new
/// image must not overwrite the old one's trace).
pub fn candidates(base: &str) -> impl Iterator<Item = String> + '_ {
    (0..=MAX_SUFFIX).map(move |i| if i == 0 { base.to_owned() } else { format!("{base}.{i}") })
}

#[cfg(test)]
mod tests {
    #[test]
    fn expands_pid_and_name() {
        assert_eq!(super::expand("/t/%e.%p.mtrace", 42, "ls"), "/t/ls.42.mtrace");
        assert_eq!(super::expand("a%%b%x%", 1, "p"), "a%b%x%");
    }

    #[test]
    fn program_names() {
        let args = super::cmdline_args(b"/usr/bin/jq\0-n\0\0.\0");
        // The empty argument is kept (jq -n '' .).
        assert_eq!(args, ["/usr/bin/jq", "-n", "", "."]);
        assert_eq!(super::cmdline_args(b""), Vec::<String>::new());
        assert_eq!(super::cmdline_args(b"sh\0-c\0echo a  b\0"), ["sh", "-c", "echo a  b"]);
        // Empty arguments are arguments; a process title and its padding
        // (redis-server's, as /proc/PID/cmdline shows it) is one.
        assert_eq!(super::cmdline_args(b"prog\0a b\0\0"), ["prog", "a b", ""]);
        assert_eq!(super::cmdline_args(b"prog\0\0\0"), ["prog", "", ""]);
        assert_eq!(super::cmdline_args(b"redis-server *:6391\0\0\0\0\0\0"), ["redis-server *:6391"]);
        assert_eq!(super::program_name(&args, "/usr/bin/jq"), "jq");
        let name = |a0: &str| super::program_name(&super::cmdline_args(a0.as_bytes()), "/usr/lib/chromium/chromium");
        // Process titles: the program they name.
        assert_eq!(name("redis-server *:6391\0\0\0"), "redis-server");
        assert_eq!(name("nginx: master process /usr/sbin/nginx\0\0"), "nginx");
        assert_eq!(
            name("/usr/lib/chromium/chromium --type=zygote --user-data-dir=/tmp/.org.chromium.x\0\0"),
            "chromium"
        );
        // A name within bounds, with no control characters.
        assert_eq!(name(&format!("/bin/{}\0", "é".repeat(40))), "é".repeat(32));
        assert_eq!(name("/bin/a\tb\nc\0"), "abc");
        // A program's own argv[0] with a space keeps its last component
        // when it has arguments.
        assert_eq!(name("/opt/My App/prog\0-v\0"), "prog");
        assert_eq!(super::program_name(&["dir/".to_string()], ""), "program");
        assert_eq!(super::program_name(&[], ""), "program");
        // The file the process runs, for an argv[0] that names it through
        // /proc; without it, the name as it is.
        assert_eq!(name("/proc/self/exe\0--type=utility\0"), "chromium");
        assert_eq!(name("/proc/42/exe\0--type=utility\0"), "chromium");
        assert_eq!(super::program_name(&["/proc/self/exe".into()], ""), "exe");
    }

    #[test]
    fn candidates_are_the_name_then_numbered() {
        let c: Vec<String> = super::candidates("t.mtrace").collect();
        assert_eq!(
            (c.len(), c[0].as_str(), c[1].as_str(), c[999].as_str()),
            (1000, "t.mtrace", "t.mtrace.1", "t.mtrace.999")
        );
    }
}
