//! The fault-injection hook of the crash tests (a leaf module: `pod` and `shortcut` both stop
//! at their steps). Inert unless [`CRASH_ENV`] is set.

/// Environment variable naming an `add` step after which the process SIGKILLs itself: a
/// fault-injection hook for the crash tests, inert unless set. The steps, in order, are
/// [`crate::pod::ADD_STEPS`] (and [`crate::shortcut::ENABLE_STEPS`]).
pub const CRASH_ENV: &str = "NSFAST_TEST_CRASH_AT";

/// Stops the process with SIGKILL if [`CRASH_ENV`] names `step` (tests only).
pub fn crash_point(step: &str) {
    if std::env::var_os(CRASH_ENV).is_some_and(|v| v == step) {
        tracing::warn!("{CRASH_ENV}={step}: killing myself");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}
