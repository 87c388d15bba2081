//! What one worker does in a transfer: which engine it belongs to and
//! whether it reads (pull) or is written to (push).

use serde::Serialize;

use crate::geometry::Mode;

/// A worker's part in the transfers of its engine pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Decode in pull mode: handshakes with prefill and posts the READs.
    PullReader,
    /// Prefill in pull mode: registers its memory and is read from.
    PullSource,
    /// Prefill in push mode: handshakes with decode and posts the WRITEs.
    PushWriter,
    /// Decode in push mode: is written to and completes on notifications.
    PushTarget,
}

impl Role {
    /// The role of a decode (`decode = true`) or prefill worker in `mode`.
    pub fn new(mode: Mode, decode: bool) -> Role {
        match (mode, decode) {
            (Mode::Pull, true) => Role::PullReader,
            (Mode::Pull, false) => Role::PullSource,
            (Mode::Push, false) => Role::PushWriter,
            (Mode::Push, true) => Role::PushTarget,
        }
    }

    /// The transfer mode of the engine pair.
    pub fn mode(self) -> Mode {
        match self {
            Role::PullReader | Role::PullSource => Mode::Pull,
            Role::PushWriter | Role::PushTarget => Mode::Push,
        }
    }

    /// Whether the worker belongs to the decode engine.
    pub fn is_decode(self) -> bool {
        matches!(self, Role::PullReader | Role::PushTarget)
    }

    /// The engine the worker belongs to.
    pub fn engine(self) -> crate::geometry::Engine {
        if self.is_decode() {
            crate::geometry::Engine::Decode
        } else {
            crate::geometry::Engine::Prefill
        }
    }

    /// Whether the worker posts the transfers (decode in pull, prefill in push).
    pub fn initiates(self) -> bool {
        matches!(self, Role::PullReader | Role::PushWriter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_round_trip_mode_and_side() {
        for mode in [Mode::Pull, Mode::Push] {
            for decode in [false, true] {
                let role = Role::new(mode, decode);
                assert_eq!((role.mode(), role.is_decode()), (mode, decode));
                assert_eq!(role.initiates(), decode == (mode == Mode::Pull));
            }
        }
    }
}
