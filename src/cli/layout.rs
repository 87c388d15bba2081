//! `kvgeom layout`.

use std::path::PathBuf;

use super::{ModeArg, VariantArgs, EXIT_BAD_INPUT, EXIT_OK};
use crate::derive::load_geometry_file;
use crate::report::layout_tables::layout_tables;

/// The command line of `kvgeom layout`.
#[derive(Clone, Debug, clap::Args)]
pub struct LayoutArgs {
    pub geometry: PathBuf,
    #[arg(long, value_enum, default_value = "pull")]
    pub mode: ModeArg,
    #[command(flatten)]
    pub variant: VariantArgs,
}

/// Print the geometry's descriptor tables in each mode asked for under the
/// chosen connector variant.
pub fn layout(args: &LayoutArgs) -> u8 {
    let (path, modes) = (&args.geometry, args.mode.modes());
    let policy = match args.variant.variant() {
        Ok(v) => v.policy(),
        Err(code) => return code,
    };
    match load_geometry_file(path) {
        Ok(g) => {
            if let Err(code) = super::refuse_other_stack(&g, path) {
                return code;
            }
            for (i, &mode) in modes.iter().enumerate() {
                if i > 0 {
                    outln!();
                }
                out!("{}", layout_tables(&g, mode, policy));
            }
            EXIT_OK
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        }
    }
}
