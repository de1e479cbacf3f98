fn main() -> std::process::ExitCode {
    turnstore::cli::main()
}
