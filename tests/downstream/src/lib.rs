//! Nothing of its own: the tests in `tests/` (linked from the crate's) are what this package is
//! for. See `Cargo.toml`.
