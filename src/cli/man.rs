//! `proxywarden man`: one manual page for the program and every command.
//! clap_mangen alone would list the commands as pages of their own
//! (`proxywarden-serve(1)`, …) that nobody installs; here each command's
//! description and options are a subsection of the one page instead.

use std::io::Write;

use clap::Command;
use roff::{Roff, bold, roman};

/// Renders the page for `cmd` (the whole command line) into `out`.
pub fn render(cmd: Command, out: &mut dyn Write) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(cmd.clone());
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    let mut heading = Roff::new();
    heading.control("SH", ["COMMANDS"]);
    heading.to_writer(out)?;
    for sub in visible(&cmd) {
        command(sub, cmd.get_name(), out)?;
    }
    man.render_version_section(out)?;
    Ok(())
}

/// The subcommands a user may type (not clap's `help`).
fn visible(cmd: &Command) -> impl Iterator<Item = &Command> {
    cmd.get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
}

/// One command's subsection: its full name, what it does, its options,
/// then its own subcommands the same way.
fn command(cmd: &Command, parent: &str, out: &mut dyn Write) -> std::io::Result<()> {
    let name = format!("{parent} {}", cmd.get_name());
    let mut roff = Roff::new();
    roff.control("SS", [name.as_str()]);
    if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
        for paragraph in about.to_string().split("\n\n") {
            roff.control("PP", [])
                .text([roman(paragraph.replace('\n', " "))]);
        }
    }
    roff.to_writer(out)?;
    // The options as clap_mangen lays them out, under this subsection
    // instead of a section of their own.
    let mut options = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render_options_section(&mut options)?;
    let options = String::from_utf8_lossy(&options);
    for line in options.lines() {
        match line.strip_prefix(".SH ") {
            Some(heading) => {
                let mut roff = Roff::new();
                let heading = heading.trim_matches('"');
                roff.control("PP", []).text([bold(format!("{heading}:"))]);
                roff.to_writer(out)?;
            }
            None => writeln!(out, "{line}")?,
        }
    }
    for sub in visible(cmd) {
        command(sub, &name, out)?;
    }
    Ok(())
}
