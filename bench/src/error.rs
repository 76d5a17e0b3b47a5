//! The benchmark's own error type, shared by the runner and the renderer.

/// Errors of the benchmark itself: a driver's, a backend's, or a message.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A result with [`BoxError`].
pub(crate) type Res<T> = Result<T, BoxError>;
