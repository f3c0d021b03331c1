//! The recording options of the commands that start a producer (`run`,
//! `server`, `attach`): one flattened set of clap arguments, validated
//! once into the typed [`Recording`] every producer reads
//! (`mtrace_format::recording`): the preload through the variables
//! [`Recording::vars`] renders, the ptrace tracer as it is.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};
use mtrace_analysis::report;
use mtrace_format::protocol::MAX_DEPTH;
use mtrace_format::recording::Recording;
use mtrace_format::settings;
use mtrace_ptrace::Hooks;

/// The options `run`, `server` and `attach` share (`-d` is the report's
/// too, so it comes with the report options and is passed in).
#[derive(clap::Args, Clone)]
pub struct RecordingArgs {
    /// Record the backtrace of every free too (MTRACE_CHECK_FREES=1), so that
    /// wrong frees (mismatched, double, invalid) show where they were
    /// freed; they are found without it too. Costs a second unwinding per
    /// free (docs/PERFORMANCE.md).
    #[arg(short = 'S', long = "check-frees")]
    pub check_frees: bool,
    /// Sample: record one allocation per BYTES allocated on average
    /// (`512K`, `2M`; MTRACE_SAMPLE_RATE), and every one of at least
    /// BYTES, instead of all of them: near the program's own speed, for
    /// production; every count reported is then an estimate
    /// (docs/SAMPLING.md). 0: record every allocation.
    #[arg(long, value_name = "BYTES", value_parser = bytes_arg)]
    pub sample_rate: Option<u64>,
    /// Trace from outside with ptrace instead of libmtrace.so (uprobes or
    /// breakpoints on the allocation functions, see --hooks): for
    /// statically linked programs and where the library cannot be loaded;
    /// slower (docs/PTRACE.md).
    #[arg(long)]
    pub ptrace: bool,
    /// With --ptrace, how the allocation functions are hooked: `uprobes`
    /// (kernel uprobes, no stop per call; root or CAP_PERFMON),
    /// `breakpoints` (a stop per call; any user who may ptrace the
    /// program), or `auto` (uprobes where allowed).
    #[arg(long, value_name = "HOOKS", default_value = "auto", requires = "ptrace", value_parser = hooks_arg())]
    pub hooks: Hooks,
}

impl RecordingArgs {
    /// The recording these options and `depth` (`-d`) ask for, on top of
    /// what this process's `MTRACE_*` variables say (each invalid one
    /// warned about once, here, so that the program's processes are handed
    /// only valid values). Errors: a depth outside 1 to 256.
    pub fn recording(&self, depth: Option<usize>) -> Result<Recording> {
        let mut r = Recording::from_env();
        if let Some(d) = depth {
            if !(1..=MAX_DEPTH).contains(&d) {
                bail!("-d {d}: the depth must be 1 to {MAX_DEPTH}");
            }
            r.depth = d;
        }
        r.check_frees |= self.check_frees;
        if let Some(rate) = self.sample_rate {
            r.sample_rate = rate;
        }
        Ok(r)
    }

    /// The options again, as `mtrace server` takes them (`run -i` starts one).
    pub fn server_args(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.check_frees {
            v.push("-S".to_owned());
        }
        if let Some(r) = self.sample_rate {
            v.extend(["--sample-rate".to_owned(), r.to_string()]);
        }
        if self.ptrace {
            v.extend(["--ptrace".to_owned(), "--hooks".to_owned(), self.hooks.name().to_owned()]);
        }
        v
    }

    /// Turns `--ptrace` on when the program to run, `exec`, is a static
    /// executable, and says so in one line on standard error: no loader
    /// runs in it to preload libmtrace.so, and without `--ptrace` its run
    /// left no trace at all (only "no trace was written"). Nothing when
    /// `--ptrace` was given, or the program is not one
    /// ([`report::processes::static_executable`]).
    /// So too for a program another C library's loader starts (musl's):
    /// libmtrace.so is glibc's, and that loader refused it with a wall of
    /// relocation errors and the program's exit status 127
    /// ([`report::processes::foreign_loader`]).
    pub fn ptrace_if_static(&mut self, exec: &str) {
        if self.ptrace {
            return;
        }
        if let Some(path) = report::processes::static_executable(exec) {
            eprintln!(
                "mtrace: {}: a static executable, which libmtrace.so cannot be preloaded into: traced with --ptrace",
                path.display()
            );
            self.ptrace = true;
        } else if let Some((path, loader)) = report::processes::foreign_loader(exec) {
            eprintln!(
                "mtrace: {}: started by {loader}, another C library's loader than the glibc libmtrace.so is built \
                 for: traced with --ptrace",
                path.display()
            );
            self.ptrace = true;
        }
    }

    /// The ptrace tracer's options for recording `r`; each setting of `r`
    /// the tracer does not carry out ([`ignored_under_ptrace`]) is warned
    /// about once on stderr, rather than dropped in silence.
    pub fn ptrace_options(&self, r: Recording, scan_at_detach: bool) -> mtrace_ptrace::Options {
        for s in ignored_under_ptrace(&r) {
            eprintln!("mtrace: {s} has no effect under --ptrace");
        }
        mtrace_ptrace::Options { recording: r, scan_at_detach, hooks: self.hooks }
    }
}

/// What happens at the program's exit, shared by `run` and `server` (so
/// that `run`, `run -i` and `server`/`client` give the same leak summary).
#[derive(clap::Args, Clone)]
pub struct AtExitArgs {
    /// No leak scan at exit (MTRACE_SCAN=0): the report lists every block
    /// not freed, by backtrace (as `mtrace report` of a trace without a
    /// scan).
    #[arg(long)]
    pub no_scan: bool,
    /// Call glibc's `__libc_freeres()` at exit (MTRACE_FREERES; valgrind's
    /// option of the same name): glibc frees what it keeps for the
    /// process's lifetime (stdio buffers, the loader's tables, the stacks
    /// of exited threads and their DTVs), which is then no leak. `no` for
    /// a program that breaks with it.
    #[arg(long, value_name = "yes|no", default_value = "yes", value_parser = yes_no, action = clap::ArgAction::Set)]
    pub run_libc_freeres: bool,
}

impl AtExitArgs {
    /// Sets the exit scan (on unless `--no-scan`) and freeres in `r`.
    pub fn apply(&self, r: &mut Recording) {
        r.scan = !self.no_scan;
        r.freeres &= self.run_libc_freeres;
    }

    /// These options as `mtrace server` takes them (`run -i`).
    pub fn server_args(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.no_scan {
            v.push("--no-scan");
        }
        if !self.run_libc_freeres {
            v.extend(["--run-libc-freeres", "no"]);
        }
        v
    }
}

/// `yes` or `no` (valgrind's spelling of its boolean options).
fn yes_no(v: &str) -> Result<bool, String> {
    match v {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(format!("{v:?} is neither yes nor no")),
    }
}

/// The settings of `r` that differ from their defaults and that only the
/// preload carries out (`NAME=value` each): the ptrace tracer records from
/// the start, follows every fork and exec, unwinds with framehop on its
/// own clock, and never calls glibc's freeres (docs/PTRACE.md).
pub fn ignored_under_ptrace(r: &Recording) -> Vec<String> {
    use mtrace_format::recording::{CLOCK, FOLLOW_EXEC, FOLLOW_FORK, START, TEST_ORDER, UNWINDER};
    let only_the_preloads = [START, FOLLOW_FORK, FOLLOW_EXEC, UNWINDER, CLOCK, TEST_ORDER];
    r.vars()
        .into_iter()
        .filter(|(s, _)| only_the_preloads.iter().any(|o| o.name() == s.name()))
        .filter_map(|(s, v)| Some(format!("{}={}", s.name(), v?)))
        .collect()
}

/// Gives the program `cmd` starts recording `r`: each setting's variable
/// set where it differs from the default and removed where it does not,
/// so that the preload reads exactly `r` (not a stale or invalid value of
/// the user's environment).
pub fn hand_to(cmd: &mut Command, r: &Recording) {
    for (s, v) in r.vars() {
        match v {
            Some(v) => cmd.env(s.name(), v),
            None => cmd.env_remove(s.name()),
        };
    }
}

/// libmtrace.so: `MTRACE_LIB`, else next to this executable.
pub fn find_lib() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(settings::LIB.name()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("MTRACE_LIB={}: no such file", p.display());
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().context("cannot find the mtrace executable")?;
    let p = exe.with_file_name("libmtrace.so");
    if !p.is_file() {
        bail!("{} not found (build it with `cargo build`, or set MTRACE_LIB)", p.display());
    }
    Ok(p.canonicalize()?)
}

/// A byte count with an optional unit (`4096`, `512K`, `2M`; see
/// [`mtrace_format::sampling::parse_bytes`]).
pub fn bytes_arg(v: &str) -> Result<u64, String> {
    mtrace_format::sampling::parse_bytes(v).ok_or_else(|| format!("{v:?} is not a byte count (4096, 512K, 2M, 1G)"))
}

/// `--hooks`: one of [`mtrace_ptrace::Hooks::ALL`] by its name (clap
/// lists the names in the help and in completions).
fn hooks_arg() -> impl clap::builder::TypedValueParser<Value = Hooks> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Hooks::ALL.map(Hooks::name)).map(|name| {
        // Always found: the parser let only these names through.
        Hooks::ALL.into_iter().find(|h| h.name() == name).unwrap_or(Hooks::Auto)
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use mtrace_format::recording::Recording;

    /// How `a` is written on the command line: `--long` and `-s`.
    fn spellings(a: &clap::Arg) -> Vec<String> {
        let long = a.get_long().map(|l| format!("--{l}"));
        let short = a.get_short().map(|s| format!("-{s}"));
        long.into_iter().chain(short).collect()
    }

    fn help(a: &clap::Arg) -> String {
        a.get_long_help().or(a.get_help()).map(|h| h.to_string()).unwrap_or_default()
    }

    /// A setting's variable and its `mtrace run` option come from one
    /// definition (`mtrace_format::recording`): the option exists and its
    /// help names the variable; a visible option whose help names a
    /// setting's variable is that setting's option.
    #[test]
    fn each_setting_and_its_option_name_each_other() {
        let cli = crate::Cli::command();
        let run = cli.find_subcommand("run").expect("run");
        for s in Recording::SETTINGS.iter().filter(|s| !s.option.is_empty()) {
            let arg = run
                .get_arguments()
                .find(|a| spellings(a).iter().any(|w| w == s.option))
                .unwrap_or_else(|| panic!("{}: run has no option {}", s.name(), s.option));
            assert!(help(arg).contains(s.name()), "{} {}: {}", s.option, s.name(), help(arg));
        }
        for a in run.get_arguments().filter(|a| !a.is_hide_set()) {
            for s in Recording::SETTINGS.iter().filter(|s| help(a).contains(s.name())) {
                assert!(spellings(a).iter().any(|w| w == s.option), "{:?} names {}", spellings(a), s.name());
            }
        }
    }

    #[test]
    fn settings_only_the_preload_carries_out_are_named_under_ptrace() {
        use mtrace_format::recording::Unwinder;
        let r =
            Recording { start: false, unwinder: Unwinder::Libgcc, depth: 8, check_frees: true, ..Default::default() };
        assert_eq!(super::ignored_under_ptrace(&r), ["MTRACE_START=off", "MTRACE_UNWINDER=libgcc"]);
        assert!(super::ignored_under_ptrace(&Recording::default()).is_empty());
    }

    /// `run`, `server` and `attach` take the same recording options (one
    /// flattened RecordingArgs, and `-d`).
    #[test]
    fn the_commands_that_start_a_producer_take_the_same_recording_options() {
        let cli = crate::Cli::command();
        for sub in ["run", "server", "attach"] {
            let c = cli.find_subcommand(sub).expect(sub);
            for opt in ["-d", "-S", "--sample-rate", "--ptrace", "--hooks"] {
                assert!(c.get_arguments().any(|a| spellings(a).iter().any(|w| w == opt)), "{sub} {opt}");
            }
        }
    }

    /// `run -i` hands its recording options to the `mtrace server` it
    /// starts (`server_args`): each of them, set away from its default,
    /// reads back the same on the server's side, and an option added to
    /// either set fails here until it is handed on too.
    #[test]
    fn run_i_hands_every_recording_option_to_its_server() {
        use clap::{CommandFactory, Parser};
        #[derive(Parser)]
        struct Both {
            #[command(flatten)]
            rec: super::RecordingArgs,
            #[command(flatten)]
            at_exit: super::AtExitArgs,
        }
        let all = ["-S", "--sample-rate", "4K", "--ptrace", "--hooks", "breakpoints", "--no-scan"];
        let all = all.iter().copied().chain(["--run-libc-freeres", "no"]);
        let a = Both::try_parse_from(std::iter::once("mtrace").chain(all.clone())).unwrap();
        let handed: Vec<String> =
            a.rec.server_args().into_iter().chain(a.at_exit.server_args().into_iter().map(str::to_owned)).collect();
        let b = Both::try_parse_from(std::iter::once("mtrace".to_owned()).chain(handed)).unwrap();
        let fields = |x: &Both| {
            (
                x.rec.check_frees,
                x.rec.sample_rate,
                x.rec.ptrace,
                x.rec.hooks.name(),
                x.at_exit.no_scan,
                x.at_exit.run_libc_freeres,
            )
        };
        assert_eq!(fields(&b), fields(&a));
        assert_eq!(fields(&a), (true, Some(4096), true, "breakpoints", true, false));
        let given: Vec<String> = all.map(str::to_owned).collect();
        for arg in Both::command().get_arguments() {
            let set = spellings(arg).iter().any(|s| given.contains(s));
            assert!(set, "{:?}: not set by this test, so not known to reach the server", arg.get_id());
        }
    }
}
