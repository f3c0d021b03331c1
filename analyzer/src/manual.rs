//! `mtrace manpage DIR` and `mtrace completions SHELL`: generated from
//! the command line's definition, so they never drift from it.

use std::process::ExitCode;

/// `mtrace manpage DIR`: mtrace.1 and mtrace-SUBCOMMAND.1 (clap_mangen).
pub fn write_manpages(cmd: clap::Command, dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    let mut pages = vec![("mtrace".to_owned(), cmd.clone())];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("mtrace-{}", sub.get_name());
        let bin = format!("mtrace {}", sub.get_name());
        pages.push((name.clone(), sub.clone().display_name(name).bin_name(bin)));
    }
    for (name, c) in pages {
        let path = dir.join(format!("{name}.1"));
        let mut page = Vec::new();
        clap_mangen::Man::new(c).render(&mut page)?;
        // clap_mangen heads the after-help "EXTRA"; ours is the
        // environment (mtrace_format::settings::help), the section man(7)
        // calls ENVIRONMENT.
        let page = String::from_utf8_lossy(&page).replace("\n.SH EXTRA\n", "\n.SH ENVIRONMENT\n");
        std::fs::write(&path, page).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `mtrace completions SHELL`: the completion script on standard output.
pub fn write_completions(mut cmd: clap::Command, shell: clap_complete::Shell) -> ExitCode {
    clap_complete::generate(shell, &mut cmd, "mtrace", &mut std::io::stdout());
    ExitCode::SUCCESS
}
