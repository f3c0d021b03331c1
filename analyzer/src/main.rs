//! `mtrace`: reads traces written by libmtrace.so and reports what leaked.

mod arriving;
mod attach;
mod console;
mod cut;
mod diff;
mod flags;
mod keep;
mod manual;
mod mistakes;
mod recording;
mod relay;
mod report;
mod run;
mod wake;

use mtrace_analysis::{input, output};

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "mtrace", version, about = "Memory tracer and leak finder for C and C++ programs")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the report of a trace file.
    Report(report::ReportArgs),
    /// Run a program under the tracer and print its report when it ends.
    #[command(after_help = mtrace_format::settings::help())]
    Run(run::RunArgs),
    /// Compare two traces (two runs, or two builds): per backtrace, the
    /// change in bytes not freed, at the peak, and in allocation calls.
    Diff(diff::DiffArgs),
    /// Trace a running process for a while, then report what it allocated
    /// meanwhile and still holds; the process goes on untraced.
    Attach(attach::AttachArgs),
    /// Run a program on this machine (the target) and relay its trace to
    /// one `mtrace client` at a time.
    Server(relay::server::ServerArgs),
    /// Connect to an `mtrace server`, keep and report the program's trace
    /// here (the host); `-i` for the console while it runs.
    Client(relay::client::ClientArgs),
    /// Cut a trace to its newest part, within a size: a checkpoint that
    /// restates every block live then, and the events after it.
    Cut(cut::CutArgs),
    /// Keep the trace of every process that streams to a socket
    /// (`MTRACE_OUTPUT=unix:PATH`) within a size or an age, until stopped:
    /// for programs started with LD_PRELOAD by something other than mtrace.
    Keep(keep::KeepArgs),
    /// Print the shell completion script for SHELL (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the manual pages, mtrace(1) and one per subcommand
    /// (mtrace-report(1), …), into DIR (e.g. ~/.local/share/man/man1).
    Manpage { dir: PathBuf },
}

/// `mtrace [PROG] LOG` without a subcommand: glibc's mtrace script's usage.
fn glibc_compat(args: &[String]) -> Option<ExitCode> {
    // A subcommand's name (or alias) is never a program: clap's own list.
    let cli = <Cli as clap::CommandFactory>::command();
    let known = |a: &str| {
        a == "help" || cli.get_subcommands().any(|c| c.get_name() == a || c.get_all_aliases().any(|n| n == a))
    };
    if args.len() < 2 || args.len() > 3 || known(&args[1]) || args[1].starts_with('-') {
        return None;
    }
    // The glibc form only when its log is one (its first line); otherwise
    // what the user probably meant, or clap's own error.
    let last = Path::new(args.last()?);
    if !input::glibc_log::is_log(last) {
        let line = mistakes::not_a_log(args)?;
        if args.len() == 3 && !last.exists() {
            eprintln!("mtrace: {}: no such file (glibc's form: mtrace PROG LOG)", last.display());
        }
        eprintln!("mtrace: {line}");
        return Some(ExitCode::from(2));
    }
    let (prog, log) = match args {
        [_, log] => (None, PathBuf::from(log)),
        [_, prog, log] => (Some(PathBuf::from(prog)), PathBuf::from(log)),
        _ => return None,
    };
    let mut out = std::io::stdout().lock();
    let printed = input::glibc_log::load_with_complaints(&log, prog.as_deref())
        .and_then(|(t, complaints)| Ok(output::glibc::print_compat(&t, &complaints, &mut out)?));
    Some(match printed {
        Ok(anything) => ExitCode::from(anything as u8),
        Err(e) => {
            eprintln!("mtrace: {}", output::words::without_os_error_codes(&format!("{e:#}")));
            ExitCode::from(2)
        }
    })
}

/// For clap's error `e` on the command line `args`: the unknown option
/// (as clap names it, without its `=value`) and what mtrace calls it, when
/// it is one of valgrind's or heaptrack's ([`mistakes::valgrind_option`]).
fn valgrind_hint(e: &clap::Error, args: &[String]) -> Option<(String, &'static str)> {
    if e.kind() != clap::error::ErrorKind::UnknownArgument {
        return None;
    }
    let Some(clap::error::ContextValue::String(arg)) = e.get(clap::error::ContextKind::InvalidArg) else {
        return None;
    };
    let eq = format!("{arg}=");
    let typed = args.iter().find(|a| *a == arg || a.starts_with(&eq)).unwrap_or(arg);
    Some((arg.clone(), mistakes::valgrind_option(typed)?))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(code) = glibc_compat(&args) {
        return code;
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // valgrind's and heaptrack's spellings: what mtrace calls them,
            // in place of clap's tips (it offered --leak-check-heuristics
            // for --leak-check=full).
            match valgrind_hint(&e, &args) {
                Some((arg, hint)) => {
                    // (Not clap's usage line either: it is built from the
                    // option clap guessed.)
                    eprintln!("error: unexpected argument '{arg}' found\n\nmtrace: {arg}: {hint}\n");
                    eprintln!("For more information, try '--help'.");
                }
                None => {
                    let _ = e.print();
                }
            }
            return ExitCode::from(e.exit_code() as u8);
        }
    };
    let res = match cli.cmd {
        Cmd::Report(a) => report::report(a),
        Cmd::Run(a) => run::run(a),
        Cmd::Diff(a) => diff::diff(a),
        Cmd::Cut(a) => cut::cut(a),
        Cmd::Keep(a) => keep::keep(a),
        Cmd::Attach(a) => attach::attach(a),
        Cmd::Server(a) => relay::server::server(a),
        Cmd::Client(a) => relay::client::client(a),
        Cmd::Completions { shell } => Ok(manual::write_completions(<Cli as clap::CommandFactory>::command(), shell)),
        Cmd::Manpage { dir } => manual::write_manpages(<Cli as clap::CommandFactory>::command(), &dir),
    };
    let code = match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mtrace: {}", output::words::without_os_error_codes(&format!("{e:#}")));
            // A program that could not be started: a shell's codes.
            e.downcast_ref::<mtrace_ptrace::ExecFailed>().map_or(ExitCode::from(2), |e| ExitCode::from(e.exit_code()))
        }
    };
    // Everything written and cleaned up: the program's death is ours.
    run::die_as_the_program();
    code
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    /// The command line the preload runs for a report point is one this
    /// binary takes, with the markers and output it means.
    #[test]
    fn the_preloads_report_command_parses() {
        for (seq, since) in [(1, true), (3, true), (3, false)] {
            let argv = mtrace_format::protocol::report_point_argv("/t/p.1.mtrace", seq, "/t/p-1-3.memlog", since);
            let cli = super::Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            let super::Cmd::Report(a) = cli.cmd else { panic!("{argv:?}: not `report`") };
            assert_eq!(a.trace, std::path::Path::new("/t/p.1.mtrace"));
            assert_eq!(a.report_to.output.as_deref(), Some(std::path::Path::new("/t/p-1-3.memlog")));
            assert_eq!(a.opts.until_marker.as_deref(), Some(seq.to_string().as_str()));
            let since_marker = (seq > 1 && since).then(|| (seq - 1).to_string());
            assert_eq!(a.opts.since_marker, since_marker);
        }
    }
}
