//! The handles one agent gives out: prepared descriptor lists and transfers,
//! numbered from one counter that starts at 1 (as vLLM's recorder numbers
//! them), each mapped to what the transport keeps for it.

use std::collections::HashMap;

use super::{DlistHandle, NixlError, NixlResult, XferHandle};

/// An agent's prepared lists (`D` each) and transfers (`X` each).
#[derive(Debug)]
pub(super) struct HandleTable<D, X> {
    last: u64,
    // Transfers are declared first so that they drop before the lists they
    // were made from.
    xfers: HashMap<u64, X>,
    dlists: HashMap<u64, D>,
}

impl<D, X> Default for HandleTable<D, X> {
    fn default() -> Self {
        Self {
            last: 0,
            xfers: HashMap::new(),
            dlists: HashMap::new(),
        }
    }
}

impl<D, X> HandleTable<D, X> {
    fn next(&mut self) -> u64 {
        self.last += 1;
        self.last
    }

    pub fn add_dlist(&mut self, dlist: D) -> DlistHandle {
        let handle = self.next();
        self.dlists.insert(handle, dlist);
        DlistHandle(handle)
    }

    pub fn add_xfer(&mut self, xfer: X) -> XferHandle {
        let handle = self.next();
        self.xfers.insert(handle, xfer);
        XferHandle(handle)
    }

    /// The two lists a transfer pairs; an unknown handle is
    /// [`NixlError::InvalidParam`], as NIXL answers it.
    pub fn dlist_pair(&self, local: DlistHandle, remote: DlistHandle) -> NixlResult<(&D, &D)> {
        let find = |handle: DlistHandle, side: &str| {
            self.dlists.get(&handle.0).ok_or_else(|| {
                NixlError::InvalidParam(format!("unknown {side} dlist handle {}", handle.0))
            })
        };
        Ok((find(local, "local")?, find(remote, "remote")?))
    }

    pub fn xfer(&self, xfer: XferHandle) -> NixlResult<&X> {
        self.xfers.get(&xfer.0).ok_or_else(|| unknown_xfer(xfer))
    }

    pub fn xfer_mut(&mut self, xfer: XferHandle) -> NixlResult<&mut X> {
        self.xfers
            .get_mut(&xfer.0)
            .ok_or_else(|| unknown_xfer(xfer))
    }

    pub fn remove_xfer(&mut self, xfer: XferHandle) -> NixlResult<X> {
        self.xfers.remove(&xfer.0).ok_or_else(|| unknown_xfer(xfer))
    }

    pub fn remove_dlist(&mut self, dlist: DlistHandle) -> NixlResult<D> {
        self.dlists
            .remove(&dlist.0)
            .ok_or_else(|| NixlError::NotFound(format!("unknown dlist handle {}", dlist.0)))
    }

    /// Drop every transfer, then every list.
    #[cfg(feature = "nixl")]
    pub fn clear(&mut self) {
        self.xfers.clear();
        self.dlists.clear();
    }
}

fn unknown_xfer(xfer: XferHandle) -> NixlError {
    NixlError::NotFound(format!("unknown transfer handle {}", xfer.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_transfers_share_one_counter_from_one() {
        let mut t = HandleTable::<&str, &str>::default();
        assert_eq!(t.add_dlist("a"), DlistHandle(1));
        assert_eq!(t.add_xfer("x"), XferHandle(2));
        assert_eq!(t.add_dlist("b"), DlistHandle(3));
        assert_eq!(
            t.dlist_pair(DlistHandle(1), DlistHandle(3)),
            Ok((&"a", &"b"))
        );
        assert_eq!(t.xfer(XferHandle(2)), Ok(&"x"));
    }

    #[test]
    fn unknown_handles_are_errors_of_the_kinds_nixl_returns() {
        let mut t = HandleTable::<(), ()>::default();
        let list = t.add_dlist(());
        assert!(matches!(
            t.dlist_pair(DlistHandle(9), list),
            Err(NixlError::InvalidParam(m)) if m == "unknown local dlist handle 9"
        ));
        assert!(matches!(
            t.dlist_pair(list, DlistHandle(9)),
            Err(NixlError::InvalidParam(m)) if m == "unknown remote dlist handle 9"
        ));
        assert!(matches!(t.xfer(XferHandle(1)), Err(NixlError::NotFound(_))));
        assert!(matches!(
            t.remove_xfer(XferHandle(1)),
            Err(NixlError::NotFound(_))
        ));
        assert_eq!(t.remove_dlist(list), Ok(()));
        assert!(matches!(t.remove_dlist(list), Err(NixlError::NotFound(_))));
    }
}
