//! The `kvgeom` command line.

fn main() {
    println!("kvgeom {}", env!("CARGO_PKG_VERSION"));
}
