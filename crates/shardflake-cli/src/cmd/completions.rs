//! `shardflake completions <shell>` and `shardflake man`: shell completion
//! scripts and a roff man page, both made from the same clap definition as
//! `--help`, written to stdout.

use anyhow::Context;
use clap_complete::Shell;

use super::with_stdout;

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  shardflake completions bash > ~/.local/share/bash-completion/completions/shardflake
  shardflake completions zsh > \"${fpath[1]}/_shardflake\"
  shardflake completions fish > ~/.config/fish/completions/shardflake.fish")]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    shell: Shell,
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  shardflake man > shardflake.1 && man ./shardflake.1
  shardflake man | gzip > /usr/local/share/man/man1/shardflake.1.gz")]
pub struct ManArgs {}

/// Writes the completion script for `args.shell` of `command` to stdout.
pub fn run_completions(args: CompletionsArgs, mut command: clap::Command) -> anyhow::Result<()> {
    let name = command.get_name().to_string();
    with_stdout(|out| {
        let mut buf = Vec::new();
        clap_complete::generate(args.shell, &mut command, name, &mut buf);
        out.write_all(&buf).context("writing to stdout")
    })
}

/// Writes the man page of `command` (roff, section 1) to stdout.
pub fn run_man(_args: ManArgs, command: clap::Command) -> anyhow::Result<()> {
    let mut buf = Vec::new();
    clap_mangen::Man::new(command)
        .render(&mut buf)
        .context("rendering the man page")?;
    with_stdout(|out| out.write_all(&buf).context("writing to stdout"))
}
