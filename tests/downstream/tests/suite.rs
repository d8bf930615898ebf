//! The crate's golden reference cases and path tests (the crate's own files, linked), in one
//! binary as in the crate, built as a project that imports the crate builds them.

mod common;

mod paths;
mod reference;
