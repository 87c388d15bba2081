//! NIXL's argument rules, for checking them in process: the transfer rules
//! by [`super::Loopback`] and [`super::DryRun`] (the real transport leaves
//! them to NIXL), the agent name rule wherever agent names are unique.

use super::{DlistTarget, NixlError, NixlResult};

/// Agent names must be usable as NIXL names and as notification keys.
pub(super) fn check_agent_name(name: &str) -> NixlResult<()> {
    if name.is_empty() || name.contains('\0') {
        return Err(NixlError::InvalidParam(format!(
            "agent name {name:?} must be non-empty and free of NUL bytes"
        )));
    }
    Ok(())
}

/// The checks NIXL makes first: the local handle was prepared locally, the
/// remote one against a remote agent, and the index lists are non-empty and
/// of equal length.
pub(super) fn check_xfer_sides(
    local: &DlistTarget,
    local_ids: &[u32],
    remote: &DlistTarget,
    remote_ids: &[u32],
) -> NixlResult<()> {
    if *local != DlistTarget::Local || matches!(remote, DlistTarget::Local) {
        return Err(NixlError::InvalidParam(
            "local handle must be prepared locally and remote handle against a remote agent".into(),
        ));
    }
    if local_ids.is_empty() || local_ids.len() != remote_ids.len() {
        return Err(NixlError::InvalidParam(format!(
            "index lists differ in length or are empty: {} local vs {} remote",
            local_ids.len(),
            remote_ids.len()
        )));
    }
    Ok(())
}

/// Every index must address a row of its prepared list (`*_len` rows).
pub(super) fn check_xfer_ranges(
    local_len: u64,
    local_ids: &[u32],
    remote_len: u64,
    remote_ids: &[u32],
) -> NixlResult<()> {
    if let Some(bad) = local_ids.iter().find(|&&i| u64::from(i) >= local_len) {
        return Err(NixlError::InvalidParam(format!(
            "local index {bad} out of range (list has {local_len} descriptors)"
        )));
    }
    if let Some(bad) = remote_ids.iter().find(|&&i| u64::from(i) >= remote_len) {
        return Err(NixlError::InvalidParam(format!(
            "remote index {bad} out of range (list has {remote_len} descriptors)"
        )));
    }
    Ok(())
}
