//! Integration tests of the `calibrate` crate (one binary: `cargo test -p calibrate --test it`).

mod calibrate;
