//! Every input limit in one place, shared by the geometry loader, the trace
//! reader and the command line, so that a file and an option can never
//! disagree. Each limit keeps a run bounded in time and memory; real models
//! stay far below all of them. A leaf: it imports no other kvgeom module.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest geometry file, trace file, or decompressed trace, in bytes.
pub const MAX_INPUT_BYTES: u64 = 64 << 20;

/// Most prompt lengths one sweep of one geometry may run, from a file's
/// list, `--prompts`, or the default residue sweep.
pub const MAX_PROMPTS: u64 = 100_000;

/// Largest page (one logical block of one layer slot on one rank, padding
/// included), in bytes.
pub const MAX_PAGE_BYTES: u64 = 1 << 30;

/// Most conv channels of one linear-attention layer of an SGLang hybrid
/// model (`[model.state]`: Mamba2 `x | B | C`, GDN and KDA `q | k | v`),
/// before TP splits them. One slot's conv or temporal state of one layer
/// is also at most [`MAX_PAGE_BYTES`], as vLLM's padded page holding it is.
pub const MAX_STATE_CHANNELS: u64 = 1 << 20;

/// Most layer slots (registered regions per rank) of a model.
pub const MAX_LAYER_SLOTS: u32 = 4_096;

/// Largest TP size of an engine.
pub const MAX_TP_SIZE: u32 = 1_024;

/// Most logical blocks in one rank's pool.
pub const MAX_POOL_BLOCKS: u32 = 1 << 24;

/// Longest prompt a case may have, in tokens (a million-token context).
pub const MAX_PROMPT_LEN: u32 = 1 << 20;

/// Most cases `--random` may draw.
pub const MAX_RANDOM_CASES: u64 = 10_000_000;

/// `--threads` is capped at this many threads per core.
pub const THREADS_PER_CORE: usize = 4;

/// Why an input file was not read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// Reading the file's metadata or its bytes failed.
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        /// The input.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The path is not a regular file.
    #[error("{}: not a regular file (a folder, FIFO, device or socket); give a file", path.display())]
    NotRegular {
        /// The input.
        path: PathBuf,
    },
    /// The file, or the decompressed stream, holds more than `limit` bytes.
    #[error("{}: larger than the input limit of {limit} bytes", path.display())]
    TooLarge {
        /// The input.
        path: PathBuf,
        /// The limit it exceeds, in bytes.
        limit: u64,
    },
}

impl InputError {
    /// The problem without the path (for messages that name it already).
    pub fn reason(&self) -> String {
        match self {
            InputError::Io { source, .. } => format!("cannot read: {source}"),
            InputError::NotRegular { .. } => {
                "not a regular file (a folder, FIFO, device or socket); give a file".into()
            }
            InputError::TooLarge { limit, .. } => {
                format!("larger than the input limit of {limit} bytes")
            }
        }
    }
}

/// Read a regular file of at most `limit` bytes; stops reading at the limit
/// (a growing file, or a device, never makes it read more).
pub fn read_capped(path: &Path, limit: u64) -> Result<Vec<u8>, InputError> {
    let io = |source| InputError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(InputError::NotRegular {
            path: path.to_path_buf(),
        });
    }
    if meta.len() > limit {
        return Err(InputError::TooLarge {
            path: path.to_path_buf(),
            limit,
        });
    }
    let mut bytes = Vec::new();
    fs::File::open(path)
        .map_err(io)?
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > limit {
        return Err(InputError::TooLarge {
            path: path.to_path_buf(),
            limit,
        });
    }
    Ok(bytes)
}

/// [`read_capped`], as UTF-8 text; text that is not UTF-8 is an
/// [`InputError::Io`] of kind `InvalidData`.
pub fn read_text_capped(path: &Path, limit: u64) -> Result<String, InputError> {
    let bytes = read_capped(path, limit)?;
    String::from_utf8(bytes).map_err(|e| InputError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()),
    })
}

/// Read `reader` to its end, failing once it yields more than `limit`
/// bytes (a decompression bomb stops there). `what` names the input.
pub fn read_to_end_capped(
    reader: impl Read,
    limit: u64,
    what: &Path,
) -> Result<Vec<u8>, InputError> {
    let mut bytes = Vec::new();
    reader
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| InputError::Io {
            path: what.to_path_buf(),
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(InputError::TooLarge {
            path: what.to_path_buf(),
            limit,
        });
    }
    Ok(bytes)
}

/// The cores this process may use (1 when unknown).
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_reads_refuse_large_files_and_non_files() {
        let dir = std::env::temp_dir().join(format!("kvgeom-limits-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("small.txt");
        fs::write(&file, b"hello").unwrap();
        assert_eq!(read_capped(&file, 5).unwrap(), b"hello");
        assert!(matches!(
            read_capped(&file, 4),
            Err(InputError::TooLarge { limit: 4, .. })
        ));
        assert!(matches!(
            read_capped(&dir, 100),
            Err(InputError::NotRegular { .. })
        ));
        let err = read_to_end_capped(std::io::repeat(0).take(10), 9, &file).unwrap_err();
        assert!(err
            .to_string()
            .contains("larger than the input limit of 9 bytes"));
        let _ = fs::remove_dir_all(&dir);
    }
}
