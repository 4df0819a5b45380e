//! Every flag of every command that takes a path, by what the command does with it. A test walks the
//! clap definitions and fails on a path flag missing here, and `tests/it/bundle_misuse.rs` (which includes this
//! file) runs every output flag against a model and a bundle's parts: each is checked by
//! `engine::outputs::guard` before any work.

/// `(subcommand, flag id)` of every flag naming a file the command writes.
pub const OUTPUT_FLAGS: &[(&str, &str)] = &[
    ("bench", "plot"),
    ("calibrate", "output"),
    ("convert", "out"),
    ("plan", "output"),
    ("profile", "out"),
    ("train-predictor", "out"),
];

/// Flag ids naming files (or a model folder) the commands only read.
pub const INPUT_FLAGS: &[&str] = &[
    "model",
    "profile",
    "predictor",
    "plan",
    "corpus",
    "text",
    "prompts",
    "measure_speculation",
    "file",
    "offload",
    "device",
    "bundle",
    "draft",
];

/// Flag ids naming a folder the command writes a scratch file of its own into (never a file given).
pub const SCRATCH_FOLDER_FLAGS: &[&str] = &["dir"];
