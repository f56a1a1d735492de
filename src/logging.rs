//! Logging for the daemons: `log` + `env_logger` to stderr, the level from `SUP_LOG`
//! (or `RUST_LOG`), `info` by default.

/// Sets the logger up once, first thing in `main`.
pub fn init() {
    let level = std::env::var("SUP_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".into());
    env_logger::Builder::new()
        .parse_filters(&level)
        .format_target(false)
        .init();
}
