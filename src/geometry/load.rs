//! Loading geometry files and folders of them from disk.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use super::error::GeometryError;
use super::file::parse_geometry;
use super::pair::Geometry;

/// Read, parse and validate one geometry file.
pub fn load_geometry(path: impl AsRef<Path>) -> Result<Geometry, GeometryError> {
    let path = path.as_ref();
    let text = fs::read_to_string(path).map_err(|source| GeometryError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_geometry(&path.display().to_string(), &text)
}

/// Load files and folders in the order given; a folder contributes its
/// `*.toml` files (not recursive), sorted by file name. Fails on the first
/// bad file, on a folder without geometry files, and when two files define
/// the same geometry name.
pub fn load_geometries(paths: &[PathBuf]) -> Result<Vec<Geometry>, GeometryError> {
    let mut geometries = Vec::new();
    let mut first_source: HashMap<String, String> = HashMap::new();
    for path in paths {
        let files = if path.is_dir() {
            toml_files_in(path)?
        } else {
            vec![path.clone()]
        };
        for file in files {
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

/// The `*.toml` files directly inside `dir`, sorted by file name.
fn toml_files_in(dir: &Path) -> Result<Vec<PathBuf>, GeometryError> {
    let read_error = |source| GeometryError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_error)? {
        let path = entry.map_err(read_error)?.path();
        if path.extension().is_some_and(|ext| ext == "toml") && path.is_file() {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(GeometryError::EmptyFolder {
            dir: dir.to_path_buf(),
        });
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}
