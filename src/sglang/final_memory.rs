//! Where the final memory of a case the SGLang driver ran is read from:
//! the batch's `.out` files ([`CaseFolder`]) or a recorded trace's images.

use std::path::{Path, PathBuf};

use super::error::JudgeError;

/// Which of an agent's memories an image is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ImageKind {
    /// A KV region (`<agent>.r<i>`).
    Region,
    /// A hybrid model's state tensor (`<agent>.s<i>`).
    State,
}

impl ImageKind {
    /// The letter of the driver's file names (`r`, `s`).
    pub fn letter(self) -> char {
        match self {
            ImageKind::Region => 'r',
            ImageKind::State => 's',
        }
    }

    /// What it is, in messages.
    pub fn what(self) -> &'static str {
        match self {
            ImageKind::Region => "region",
            ImageKind::State => "state tensor",
        }
    }
}

/// Where the final memory of a case the driver ran is read from: the
/// batch's `.out` files, or a recorded trace's images.
pub trait FinalMemory {
    /// `agent`'s image of `kind` number `index`, `len` bytes long.
    fn image(
        &self,
        agent: &str,
        kind: ImageKind,
        index: u32,
        len: u64,
    ) -> Result<Vec<u8>, JudgeError>;

    /// Whether any final memory is there (a trace may leave it out: then
    /// only the oracles over the posted pairs run).
    fn has_images(&self) -> bool {
        true
    }
}

/// A case's folder of the batch: `<agent>.r<i>.out`, `<agent>.s<i>.out`.
pub struct CaseFolder<'a>(pub &'a Path);

impl FinalMemory for CaseFolder<'_> {
    fn image(
        &self,
        agent: &str,
        kind: ImageKind,
        index: u32,
        len: u64,
    ) -> Result<Vec<u8>, JudgeError> {
        let path = self.0.join(format!("{agent}.{}{index}.out", kind.letter()));
        read_image(path, kind.what(), len)
    }
}

/// A memory image of `expected` bytes (a `what`: region or state tensor).
pub(crate) fn read_image(
    path: PathBuf,
    what: &'static str,
    expected: u64,
) -> Result<Vec<u8>, JudgeError> {
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(source) => return Err(JudgeError::Read { path, source }),
    };
    if bytes.len() as u64 != expected {
        return Err(JudgeError::Length {
            found: bytes.len(),
            path,
            what,
            expected,
        });
    }
    Ok(bytes)
}
