//! Time limits on every wait that real NIXL, UCX or a peer process could
//! otherwise make unbounded. Each has a default and an environment
//! variable, so that a sweep, a benchmark, its peer process and the GPU
//! test binary all see the same values (`scripts/gpu-check.sh` lowers them
//! to fit its budget):
//!
//! - `KVGEOM_COMPLETION_LIMIT_S` (default 60): how long one sweep case
//!   waits for its transfers and notifications before it is reported
//!   `hung`, with what was still pending;
//! - `KVGEOM_BENCH_STALL_LIMIT_S` (default 300): how long one benchmark
//!   iteration waits for its transfers;
//! - `KVGEOM_PEER_TIMEOUT_S` (default 120): how long the benchmark waits for
//!   each line of its peer process (the first one includes the peer's
//!   planning, allocation and agent set-up).
//!
//! Values are seconds, fractions allowed; zero, negative or malformed
//! values are errors that name their variable.

use std::time::Duration;

/// Environment variable of [`completion_limit`].
pub const COMPLETION_LIMIT_VAR: &str = "KVGEOM_COMPLETION_LIMIT_S";
/// Environment variable of [`stall_limit`].
pub const STALL_LIMIT_VAR: &str = "KVGEOM_BENCH_STALL_LIMIT_S";
/// Environment variable of [`peer_timeout`].
pub const PEER_TIMEOUT_VAR: &str = "KVGEOM_PEER_TIMEOUT_S";

/// Default of [`completion_limit`].
pub const COMPLETION_LIMIT: Duration = Duration::from_secs(60);
/// Default of [`stall_limit`].
pub const STALL_LIMIT: Duration = Duration::from_secs(300);
/// Default of [`peer_timeout`].
pub const PEER_TIMEOUT: Duration = Duration::from_secs(120);

/// The longest limit accepted (about eleven days): beyond it a limit is a
/// typo, not a wait anyone means.
const MAX_SECONDS: f64 = 1e6;

/// A time limit's environment variable holds no positive number of seconds
/// (zero, negative, above about eleven days, or not a number).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{var}={text:?} is not a positive number of seconds")]
pub struct TimeLimitError {
    /// The environment variable.
    pub var: String,
    /// Its value, as set.
    pub text: String,
}

/// `text` (the value of `var`) as a positive number of seconds.
pub fn parse_seconds(var: &str, text: &str) -> Result<Duration, TimeLimitError> {
    let bad = || TimeLimitError {
        var: var.to_string(),
        text: text.to_string(),
    };
    let seconds: f64 = text.trim().parse().map_err(|_| bad())?;
    if !seconds.is_finite() || seconds <= 0.0 || seconds > MAX_SECONDS {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// The value of `var` in the environment, or `default` when it is unset.
pub fn from_env(var: &str, default: Duration) -> Result<Duration, TimeLimitError> {
    from_lookup(|name| std::env::var(name).ok(), var, default)
}

/// As [`from_env`], with `lookup` standing in for the environment.
pub fn from_lookup(
    lookup: impl Fn(&str) -> Option<String>,
    var: &str,
    default: Duration,
) -> Result<Duration, TimeLimitError> {
    match lookup(var) {
        Some(text) => parse_seconds(var, &text),
        None => Ok(default),
    }
}

/// How long a sweep case waits for its transfers to complete.
pub fn completion_limit() -> Result<Duration, TimeLimitError> {
    from_env(COMPLETION_LIMIT_VAR, COMPLETION_LIMIT)
}

/// How long a benchmark iteration waits for its transfers.
pub fn stall_limit() -> Result<Duration, TimeLimitError> {
    from_env(STALL_LIMIT_VAR, STALL_LIMIT)
}

/// How long the benchmark waits for each line of its peer process.
pub fn peer_timeout() -> Result<Duration, TimeLimitError> {
    from_env(PEER_TIMEOUT_VAR, PEER_TIMEOUT)
}

/// `d` in seconds for messages: whole seconds when it is whole.
pub fn seconds_text(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.3} s", d.as_secs_f64())
    }
}

/// `limit` as the environment variable `var` would set it, for messages
/// that say which setting to raise: `VAR=SECONDS`.
pub fn setting_text(var: &str, limit: Duration) -> String {
    format!("{var}={}", limit.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: Option<&str>) -> Result<Duration, TimeLimitError> {
        from_lookup(
            |name| (name == STALL_LIMIT_VAR).then(|| value.map(str::to_string))?,
            STALL_LIMIT_VAR,
            STALL_LIMIT,
        )
    }

    #[test]
    fn an_unset_variable_keeps_the_default() {
        assert_eq!(with(None), Ok(STALL_LIMIT));
    }

    #[test]
    fn whole_and_fractional_seconds_are_accepted() {
        assert_eq!(with(Some("20")), Ok(Duration::from_secs(20)));
        assert_eq!(with(Some(" 0.25 ")), Ok(Duration::from_millis(250)));
        assert_eq!(seconds_text(Duration::from_secs(20)), "20 s");
        assert_eq!(seconds_text(Duration::from_millis(250)), "0.250 s");
    }

    #[test]
    fn zero_negative_huge_and_malformed_values_name_their_variable() {
        for text in ["0", "-5", "abc", "", "inf", "NaN", "1e9"] {
            let e = with(Some(text)).unwrap_err();
            assert_eq!(e.var, STALL_LIMIT_VAR);
            assert_eq!(e.text, text);
            assert_eq!(
                e.to_string(),
                format!("KVGEOM_BENCH_STALL_LIMIT_S={text:?} is not a positive number of seconds")
            );
        }
    }
}
