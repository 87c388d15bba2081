//! The vLLM driver's time limits: its import of vLLM, and one case.

use std::time::Duration;

/// Time the driver may take to import vLLM before its first case.
pub const IMPORT_LIMIT: Duration = Duration::from_secs(240);
/// Default time-out of one case inside the driver.
pub const CASE_LIMIT: Duration = Duration::from_secs(10);
