//! The `rheo` command.

#![deny(clippy::unwrap_used)]

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
