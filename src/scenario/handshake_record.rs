//! [`HandshakeRecord`]: one handshake a rank of a case attempted with a
//! peer rank, as kvgeom's connector and the live drivers report it.

use serde::{Deserialize, Serialize};

/// One rank's handshake with one peer rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandshakeRecord {
    /// The rank that added the peer (`decode-0`).
    pub agent: String,
    /// The peer (`prefill-1`).
    pub remote: String,
    /// The peer was accepted.
    pub ok: bool,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Push: decode learnt the peer for notifications only (vLLM's driver
    /// reports it; kvgeom's connector never does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notif_only: Option<bool>,
}
