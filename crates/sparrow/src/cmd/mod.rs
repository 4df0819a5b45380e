//! One module per subcommand: its arguments and `run`, which parses nothing more and prints the result.

pub mod bench;
mod bench_lookup;
pub mod calibrate;
pub mod convert;
mod convert_moe;
pub mod models;
pub mod perplexity;
pub mod plan;
pub mod profile;
pub mod run;
pub mod serve;
pub mod train;
pub mod verify;
