//! The value enums of the case options: `--mode` and `--alloc`, for
//! commands that run a grid (both) and for those that show one case.

use crate::geometry::Mode;
use crate::scheduler::DecodeAllocation;

/// `pull`, `push` or `both`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ModeArg {
    Pull,
    Push,
    Both,
}

impl ModeArg {
    pub fn modes(self) -> Vec<Mode> {
        match self {
            ModeArg::Pull => vec![Mode::Pull],
            ModeArg::Push => vec![Mode::Push],
            ModeArg::Both => vec![Mode::Pull, Mode::Push],
        }
    }
}

/// One mode, for commands that show a single case.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum OneModeArg {
    Pull,
    Push,
}

impl OneModeArg {
    pub fn mode(self) -> Mode {
        match self {
            OneModeArg::Pull => Mode::Pull,
            OneModeArg::Push => Mode::Push,
        }
    }
}

/// One decode allocation model, for commands that show a single case.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum OneAllocArg {
    Mainline,
    WithLastToken,
}

impl OneAllocArg {
    pub fn allocation(self) -> DecodeAllocation {
        match self {
            OneAllocArg::Mainline => DecodeAllocation::Mainline,
            OneAllocArg::WithLastToken => DecodeAllocation::WithLastToken,
        }
    }
}

/// Decode allocation model: `mainline`, `with-last-token` or `both`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum AllocArg {
    Mainline,
    WithLastToken,
    Both,
}

impl AllocArg {
    /// The models to run; `None`: each, on every hybrid case.
    pub fn allocations(self) -> Option<Vec<DecodeAllocation>> {
        match self {
            AllocArg::Mainline => Some(vec![DecodeAllocation::Mainline]),
            AllocArg::WithLastToken => Some(vec![DecodeAllocation::WithLastToken]),
            AllocArg::Both => None,
        }
    }
}

/// Which connector a sweep runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ConnectorArg {
    /// kvgeom's Rust connector (the default).
    #[default]
    Kvgeom,
    /// vLLM's own Python connector, from the venv (scripts/install-vllm.sh).
    Vllm,
    /// Recorded v2 traces (the paths: `*.trace.json[.gz]`) replayed: each
    /// run is the recorded one, judged as check-trace judges it.
    Replay,
    /// SGLang's own P/D transfer (its NIXL backend) on `stack = "sglang"`
    /// geometries, from .sglang-venv (scripts/install-sglang.sh); push only.
    Sglang,
}

/// What moves the bytes of the vLLM driver's cases (`--nixl`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum NixlArg {
    /// The driver's NIXL stand-in (memmove between the tensors): runs
    /// wherever vLLM's venv does.
    #[default]
    StandIn,
    /// Real NIXL agents (UCX) over host memory; an error when the `nixl`
    /// package does not load in the driver's interpreter.
    Real,
    /// Real NIXL where it loads and runs, else the stand-in.
    Auto,
}

impl NixlArg {
    pub(crate) fn choice(self) -> crate::driver::NixlChoice {
        match self {
            NixlArg::StandIn => crate::driver::NixlChoice::StandIn,
            NixlArg::Real => crate::driver::NixlChoice::Real,
            NixlArg::Auto => crate::driver::NixlChoice::Auto,
        }
    }
}
