//! What `nodeipam version` and `--version` print: the crate version, the git commit and the
//! build date, stamped by build.rs; with the compiler's version, what `nodeipam_build_info`
//! says.

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const GIT_COMMIT: &str = env!("NODEIPAM_GIT_COMMIT");
pub const BUILD_DATE: &str = env!("NODEIPAM_BUILD_DATE");
pub const RUSTC: &str = env!("NODEIPAM_RUSTC_VERSION");
/// For `--version`.
pub const SHORT: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("NODEIPAM_GIT_COMMIT"),
    ", built ",
    env!("NODEIPAM_BUILD_DATE"),
    ")"
);

/// The `nodeipam version` text.
pub fn text() -> String {
    format!("nodeipam {VERSION}\ngit commit: {GIT_COMMIT}\nbuild date: {BUILD_DATE}\n")
}
