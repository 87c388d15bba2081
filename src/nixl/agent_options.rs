//! How the real transport configures every NIXL agent it creates: the
//! agent's progress thread and the UCX backend's thread pool.
//!
//! Both are performance settings only; they change nothing a transfer
//! moves. They come from the environment, so that a sweep, a benchmark and
//! its peer process all see the same values:
//!
//! - `KVGEOM_NIXL_PROGRESS_DELAY_US` (default 10): microseconds the agent's
//!   progress thread sleeps between rounds (NIXL's `pthrDelay`). vLLM
//!   0.33.0's agents use 0, a thread that spins; with several agents in one
//!   process on a small machine the spinning threads starve the one that
//!   posts and polls the transfers (docs/benchmarks.md measures it).
//! - `KVGEOM_NIXL_UCX_THREADS` (default 0, the backend's default): the UCX
//!   backend's `num_threads`, a pool of threads that post one transfer's
//!   descriptors in parallel. vLLM 0.33.0 passes 4.

use std::fmt;

use super::NixlError;

/// Environment variable of [`NixlAgentOptions::progress_delay_us`].
pub const PROGRESS_DELAY_VAR: &str = "KVGEOM_NIXL_PROGRESS_DELAY_US";
/// Environment variable of [`NixlAgentOptions::ucx_threads`].
pub const UCX_THREADS_VAR: &str = "KVGEOM_NIXL_UCX_THREADS";

/// Settings of each agent the real transport creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NixlAgentOptions {
    /// Sleep of the progress thread between rounds, in microseconds (0 spins).
    pub progress_delay_us: u64,
    /// The UCX backend's `num_threads` (0: not passed, the backend's default).
    pub ucx_threads: u32,
}

impl Default for NixlAgentOptions {
    fn default() -> Self {
        Self {
            progress_delay_us: 10,
            ucx_threads: 0,
        }
    }
}

impl NixlAgentOptions {
    /// vLLM 0.33.0's settings: a spinning progress thread, 4 UCX threads.
    pub const VLLM: NixlAgentOptions = NixlAgentOptions {
        progress_delay_us: 0,
        ucx_threads: 4,
    };

    /// The defaults, overridden by the environment variables that are set.
    pub fn from_env() -> Result<Self, NixlError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// As [`Self::from_env`], with `lookup` standing in for the environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, NixlError> {
        let defaults = Self::default();
        Ok(Self {
            progress_delay_us: parse(&lookup, PROGRESS_DELAY_VAR)?
                .unwrap_or(defaults.progress_delay_us),
            ucx_threads: parse(&lookup, UCX_THREADS_VAR)?.unwrap_or(defaults.ucx_threads),
        })
    }
}

fn parse<T: std::str::FromStr>(
    lookup: &impl Fn(&str) -> Option<String>,
    name: &str,
) -> Result<Option<T>, NixlError> {
    let Some(text) = lookup(name) else {
        return Ok(None);
    };
    text.trim().parse().map(Some).map_err(|_| {
        NixlError::InvalidParam(format!(
            "{name}={text:?} is not a non-negative whole number"
        ))
    })
}

impl fmt::Display for NixlAgentOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "progress thread delay {} us, UCX threads {}",
            self.progress_delay_us,
            if self.ucx_threads == 0 {
                "default".to_string()
            } else {
                self.ucx_threads.to_string()
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<NixlAgentOptions, NixlError> {
        NixlAgentOptions::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn unset_variables_keep_the_defaults() {
        assert_eq!(with(&[]), Ok(NixlAgentOptions::default()));
    }

    #[test]
    fn set_variables_override_each_setting() {
        let options = with(&[(PROGRESS_DELAY_VAR, "0"), (UCX_THREADS_VAR, " 4 ")]).unwrap();
        assert_eq!(options, NixlAgentOptions::VLLM);
        assert_eq!(
            options.to_string(),
            "progress thread delay 0 us, UCX threads 4"
        );
    }

    #[test]
    fn a_malformed_value_names_its_variable() {
        let err = with(&[(UCX_THREADS_VAR, "-1")]).unwrap_err();
        assert!(
            matches!(&err, NixlError::InvalidParam(m) if m.contains(UCX_THREADS_VAR) && m.contains("\"-1\"")),
            "{err}"
        );
    }
}
