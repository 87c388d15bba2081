//! The options `sweep` and `explain` share: which connector runs and how
//! (`--connector`, `--vllm-python`, `--nixl`), the variant of kvgeom's
//! connector (`--policy`, `--defect`), its transport and the memory budget.
//! Written once and flattened into both commands' arguments; an option that
//! does not apply to the chosen connector is refused (exit 2) by name.

use std::path::PathBuf;

use super::{ConnectorArg, NixlArg, VariantArgs};
use crate::scenario::TransportKind;

/// The options of a run that `sweep` and `explain` both take.
#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub variant: VariantArgs,
    #[arg(long, value_enum, default_value = "loopback")]
    pub transport: TransportKind,
    /// Memory the sweep may use (e.g. 1.5G; default: half of the memory
    /// available). Cases run in parallel only as far as it allows.
    #[arg(long, value_name = "SIZE")]
    pub max_memory: Option<String>,
    /// Which connector runs: kvgeom's, or vLLM's own from the venv
    /// (scripts/install-vllm.sh), judged by the same oracles.
    #[arg(long, value_enum, default_value = "kvgeom")]
    pub connector: ConnectorArg,
    /// The Python interpreter with vLLM (default: KVGEOM_VLLM_PYTHON,
    /// else .vllm-venv/bin/python).
    #[arg(long, value_name = "PATH")]
    pub vllm_python: Option<PathBuf>,
    /// With --connector sglang: the Python interpreter with SGLang
    /// (default: KVGEOM_SGLANG_PYTHON, else .sglang-venv/bin/python).
    #[arg(long, value_name = "PATH")]
    pub sglang_python: Option<PathBuf>,
    /// With --connector vllm or sglang: what moves the bytes, the driver's
    /// NIXL stand-in (default), real NIXL agents over host memory (needs the
    /// nixl package: scripts/install-vllm.sh --nixl, install-sglang.sh
    /// --nixl), or auto.
    #[arg(long, value_enum, value_name = "KIND")]
    pub nixl: Option<NixlArg>,
    /// With --connector vllm: who makes each request, vLLM's own scheduler
    /// (default for mainline cases) or the driver from kvgeom's placement
    /// (direct; always for --alloc with-last-token).
    #[arg(long, value_enum, value_name = "WHO")]
    pub requests: Option<RequestsArg>,
}

/// Who makes a live case's request (`--requests`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RequestsArg {
    /// vLLM's scheduler places the request and builds the workers' metadata.
    Scheduler,
    /// The driver builds the request from kvgeom's placement.
    Direct,
}

impl RunArgs {
    /// Why one of the shared options given does not apply to kvgeom's own
    /// connector, when `--connector kvgeom` runs (and `--requests`, to any
    /// connector but vLLM's).
    pub(crate) fn refused_for_kvgeom(&self) -> Option<String> {
        if let (Some(python), false) = (&self.sglang_python, self.connector == ConnectorArg::Sglang)
        {
            return Some(format!(
                "--sglang-python {}: the interpreter runs SGLang's transfer; add --connector sglang",
                python.display()
            ));
        }
        if let (Some(_), false) = (self.requests, self.connector == ConnectorArg::Vllm) {
            return Some(
                "--requests selects who makes vLLM's requests; add --connector vllm".into(),
            );
        }
        if self.connector != ConnectorArg::Kvgeom {
            return None;
        }
        if self.nixl.is_some() {
            return Some(
                "--nixl selects what moves the bytes of vLLM's connector (--connector vllm); \
                 kvgeom's own connector takes --transport loopback|nixl"
                    .into(),
            );
        }
        if let Some(python) = &self.vllm_python {
            return Some(format!(
                "--vllm-python {}: the interpreter runs vLLM's connector; add --connector vllm",
                python.display()
            ));
        }
        None
    }
}
