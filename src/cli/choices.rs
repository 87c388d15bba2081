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
