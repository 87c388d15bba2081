//! The scratch folders of driver runs: a unique name per bounded run
//! ([`scratch_for`]), a fresh folder per batch that never takes one left
//! over ([`fresh_scratch`]), and its removal unless the user asked to keep
//! it ([`remove_unless_kept`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A scratch folder for one bounded run named `what`, unique to the call:
/// runs of one process in parallel (tests, or probes from several threads)
/// never share the files their output is captured in. Not created.
pub fn scratch_for(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "kvgeom-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// A fresh scratch folder for one batch named `what`, created here.
/// Process ids are reused (pid_max may be 32768): a folder of that name may
/// be left over, kept, or still written by a driver whose kvgeom was
/// killed, so an existing one is never taken.
pub fn fresh_scratch(what: &str) -> PathBuf {
    let mut dir = scratch_for(what);
    for _ in 0..10_000 {
        match std::fs::create_dir(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => dir = scratch_for(what),
            // Created, or an error the batch reports when it writes its files.
            _ => break,
        }
    }
    dir
}

/// Remove a scratch folder unless the environment variable `keep` is set;
/// `true` when it was kept.
pub fn remove_unless_kept(dir: &Path, keep: &str) -> bool {
    if std::env::var_os(keep).is_none() {
        let _ = std::fs::remove_dir_all(dir);
        false
    } else {
        true
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_scratch_folder_is_created_fresh_never_one_that_exists() {
        let first = super::fresh_scratch("scratch-test");
        assert!(first.is_dir(), "{}", first.display());
        // The next names, as a driver of an earlier process with the same
        // id might have left (or still be filling) them.
        let name = first.file_name().unwrap().to_str().unwrap().to_string();
        let (stem, n) = name.rsplit_once('-').unwrap();
        let n: u64 = n.parse().unwrap();
        let taken: Vec<std::path::PathBuf> = (1..=2)
            .map(|k| first.with_file_name(format!("{stem}-{}", n + k)))
            .collect();
        for t in &taken {
            std::fs::create_dir_all(t).unwrap();
            std::fs::write(t.join("result.json"), b"{}").unwrap();
        }
        let next = super::fresh_scratch("scratch-test");
        let fresh = std::fs::read_dir(&next).map(|d| d.count());
        for d in taken.iter().chain([&first, &next]) {
            let _ = std::fs::remove_dir_all(d);
        }
        assert!(!taken.contains(&next), "{}", next.display());
        assert_eq!(fresh.unwrap(), 0, "{}", next.display());
    }
}
