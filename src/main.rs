//! The `director` binary: the command line lives in the library (`director::cli`).

fn main() -> std::process::ExitCode {
    director::cli::run()
}
