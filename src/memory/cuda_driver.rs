//! Which CUDA driver library this process uses. cudarc opens the first
//! name of its candidate list that loads, and that list starts with the
//! unversioned `libcuda.so` (a development link, a toolkit stub or a
//! compatibility library where one is on the library path) and ends with
//! `libcuda.so.1`, the name the driver installs and UCX's CUDA modules link.
//! Once a library with the driver's soname is loaded, UCX gets that one
//! too. So the messages name every candidate, and a stub is reported as a
//! stub, with its path.

use std::path::PathBuf;

/// The names cudarc tries, in its order (`cuda` first, then `nvcuda`).
pub fn candidates() -> Vec<String> {
    ["cuda", "nvcuda"]
        .iter()
        .flat_map(|name| cudarc::get_lib_name_candidates(name))
        .collect()
}

/// The candidate names as one line for a message: the `cuda` names in
/// order, the `nvcuda` ones (Windows' driver) summarised.
pub fn candidates_text() -> String {
    let cuda = cudarc::get_lib_name_candidates("cuda");
    format!("{}, then the same names for nvcuda", cuda.join(", "))
}

/// The file the driver was loaded from, read from the process's memory
/// map; `None` before it is loaded (or where /proc is not mounted).
pub fn loaded_library() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(library_in_map_line)
}

/// The path of a driver library mapped by one `/proc/self/maps` line.
fn library_in_map_line(line: &str) -> Option<PathBuf> {
    // address perms offset dev inode path
    let path = line.split_whitespace().nth(5)?;
    let file = path.rsplit('/').next()?;
    let driver = ["libcuda.so", "libnvcuda.so"]
        .iter()
        .any(|name| file == *name || file.starts_with(&format!("{name}.")));
    driver.then(|| PathBuf::from(path))
}

/// The loaded driver's path for messages, or a note that it is unknown.
pub fn loaded_library_text() -> String {
    loaded_library()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "an unknown file (not found in /proc/self/maps)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_candidates_start_unversioned_and_end_with_the_drivers_soname() {
        let names = cudarc::get_lib_name_candidates("cuda");
        assert_eq!(names.first().map(String::as_str), Some("libcuda.so"));
        assert_eq!(names.last().map(String::as_str), Some("libcuda.so.1"));
        assert!(candidates().len() == 2 * names.len());
        assert!(candidates_text().starts_with("libcuda.so, "));
    }

    #[test]
    fn only_driver_libraries_are_picked_from_the_map() {
        let line =
            |path: &str| format!("7f12a0000000-7f12a0200000 r-xp 00000000 fd:01 1234 {path}");
        assert_eq!(
            library_in_map_line(&line("/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05")),
            Some(PathBuf::from(
                "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"
            ))
        );
        assert_eq!(
            library_in_map_line(&line("/usr/local/cuda/lib64/stubs/libcuda.so")),
            Some(PathBuf::from("/usr/local/cuda/lib64/stubs/libcuda.so"))
        );
        assert_eq!(library_in_map_line(&line("/usr/lib/libcudart.so.13")), None);
        assert_eq!(
            library_in_map_line(&line("/usr/lib/libcuda_helper.so")),
            None
        );
        assert_eq!(
            library_in_map_line("7f12a0000000-7f12a0200000 rw-p 00000000 00:00 0"),
            None
        );
    }
}
