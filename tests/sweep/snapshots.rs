//! Layout snapshots: every shipped geometry's descriptor lists (pull from
//! decode rank 0, push from prefill rank 0) as tables with region, kind,
//! offset from the region base, length, stride and count. Review changes
//! with `cargo insta review`.

use std::path::PathBuf;

use kvgeom::connector::Policy;
use kvgeom::geometry::{load_geometry, Mode};
use kvgeom::internals::layout_tables;

#[test]
fn descriptor_layouts_of_every_geometry() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(root.join("snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("geometries"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        files.sort();
        assert!(files.len() >= 10);
        for file in files {
            let geometry = load_geometry(&file).unwrap();
            for mode in [Mode::Pull, Mode::Push] {
                insta::assert_snapshot!(
                    format!("{}-{mode}", geometry.name),
                    layout_tables(&geometry, mode, Policy::default())
                );
            }
        }
    });
}
