//! Placeholder; see bench/README.md.
fn main() {}
