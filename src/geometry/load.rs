//! Loading geometry files and folders of them from disk.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use super::error::GeometryError;
use super::file::parse_geometry;
use super::pair::Geometry;
use crate::limits::{read_capped, InputError, MAX_INPUT_BYTES};

/// Read, parse and validate one plain geometry file (a regular file of at
/// most [`MAX_INPUT_BYTES`]).
pub fn load_geometry(path: impl AsRef<Path>) -> Result<Geometry, GeometryError> {
    load_geometry_with(path.as_ref(), parse_geometry)
}

/// [`load_geometry`] with another parser of the file's text (e.g. one that
/// also reads config-named files).
pub fn load_geometry_with(
    path: &Path,
    parse: impl Fn(&str, &str) -> Result<Geometry, GeometryError>,
) -> Result<Geometry, GeometryError> {
    let bytes = read_capped(path, MAX_INPUT_BYTES).map_err(|e| match e {
        InputError::Io { path, source } => GeometryError::Read { path, source },
        other => GeometryError::Input(other),
    })?;
    let text = String::from_utf8(bytes).map_err(|e| GeometryError::Read {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    parse(&path.display().to_string(), &text)
}

/// The geometry files `path` names: itself, or for a folder the `*.toml`
/// files under it ([`toml_files_in`]).
pub fn geometry_files(path: &Path) -> Result<Vec<PathBuf>, GeometryError> {
    if path.is_dir() {
        toml_files_in(path)
    } else {
        Ok(vec![path.to_path_buf()])
    }
}

/// Load files and folders in the order given; a folder contributes the
/// `*.toml` files under it ([`toml_files_in`]). Fails on the first bad file,
/// on a folder without geometry files, and when two files define the same
/// geometry name.
pub fn load_geometries(paths: &[PathBuf]) -> Result<Vec<Geometry>, GeometryError> {
    let mut geometries = Vec::new();
    let mut first_source: HashMap<String, String> = HashMap::new();
    for path in paths {
        for file in geometry_files(path)? {
            let geometry = load_geometry(&file)?;
            let source = file.display().to_string();
            if let Some(first) = first_source.get(&geometry.name) {
                return Err(GeometryError::DuplicateName {
                    name: geometry.name,
                    first: first.clone(),
                    second: source,
                });
            }
            first_source.insert(geometry.name.clone(), source);
            geometries.push(geometry);
        }
    }
    Ok(geometries)
}

/// The `*.toml` files under `dir`, searched recursively: a folder's own
/// files sorted by name, then each of its subfolders, sorted by name, in
/// turn. Links are followed, but a folder already searched (a link back up
/// the tree, two links to one folder) is searched once, so link loops end.
/// Fails when nothing under `dir` is a geometry file.
pub fn toml_files_in(dir: &Path) -> Result<Vec<PathBuf>, GeometryError> {
    let mut files = Vec::new();
    let mut searched = HashSet::new();
    collect_toml_files(dir, &mut searched, &mut files)?;
    if files.is_empty() {
        return Err(GeometryError::EmptyFolder {
            dir: dir.to_path_buf(),
        });
    }
    Ok(files)
}

fn collect_toml_files(
    dir: &Path,
    searched: &mut HashSet<PathBuf>,
    files: &mut Vec<PathBuf>,
) -> Result<(), GeometryError> {
    let read_error = |source| GeometryError::Read {
        path: dir.to_path_buf(),
        source,
    };
    if !searched.insert(fs::canonicalize(dir).map_err(read_error)?) {
        return Ok(());
    }
    let mut own = Vec::new();
    let mut folders = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_error)? {
        let path = entry.map_err(read_error)?.path();
        if path.is_dir() {
            folders.push(path);
        } else if path.extension().is_some_and(|ext| ext == "toml") {
            // Every other `*.toml` entry counts: one that is not a regular
            // file (a device, a FIFO, a dangling or looping link) is then
            // reported by name instead of being skipped in silence.
            own.push(path);
        }
    }
    own.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    folders.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    files.extend(own);
    for folder in folders {
        collect_toml_files(&folder, searched, files)?;
    }
    Ok(())
}
