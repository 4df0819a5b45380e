//! Texts compiled into the binary (`data/`, public-domain Shakespeare, see `data/README.md`), so that
//! every command that needs a text has a default that works from any directory.

use std::path::{Path, PathBuf};

use anyhow::Result;

/// A text the binary carries.
pub struct Builtin {
    /// How it is named in messages and JSON output.
    pub name: &'static str,
    /// The text.
    pub text: &'static str,
}

/// Calibration and training text (`profile`, `train-predictor`): the first 72 KB of Tiny Shakespeare.
pub const CALIBRATION: Builtin = Builtin {
    name: "<built-in calibration text: Tiny Shakespeare, Coriolanus>",
    text: include_str!("../data/calibration.txt"),
};

/// Evaluation text (`perplexity`, sparse `bench`): the last 34 KB of Tiny Shakespeare, disjoint from
/// [`CALIBRATION`].
pub const EVAL: Builtin = Builtin {
    name: "<built-in evaluation text: Tiny Shakespeare, The Tempest>",
    text: include_str!("../data/eval.txt"),
};

/// Code-editing prompts (`bench --lookup`): 8 small functions to return with a change, one JSON
/// object `{"prompt": ...}` a line.
pub const CODE_EDIT: Builtin = Builtin {
    name: "<built-in code-editing prompts>",
    text: include_str!("../data/code-edit-prompts.jsonl"),
};

/// A text given on the command line, or a built-in one.
pub enum TextSource {
    /// A file the user named.
    File(PathBuf),
    /// A text compiled into the binary.
    Builtin(&'static Builtin),
}

/// The largest text file read (a corpus, an evaluation text).
pub const MAX_TEXT_BYTES: u64 = 1 << 30;

impl TextSource {
    /// `file` if given, else `fallback`.
    pub fn or_builtin(file: Option<&Path>, fallback: &'static Builtin) -> Self {
        match file {
            Some(p) => Self::File(p.to_path_buf()),
            None => Self::Builtin(fallback),
        }
    }

    /// The text (a file is read; an error names it).
    pub fn read(&self) -> Result<String> {
        match self {
            // A regular file of at most 1 GiB (a FIFO used to hang `perplexity -f`, `/dev/zero`
            // to be read until memory ran out).
            Self::File(p) => Ok(atomic_out::read_bounded_text(p, MAX_TEXT_BYTES)?),
            Self::Builtin(b) => Ok(b.text.to_string()),
        }
    }

    /// The file, if the text is one (outputs are checked against it).
    pub fn file(&self) -> Option<&Path> {
        match self {
            Self::File(p) => Some(p),
            Self::Builtin(_) => None,
        }
    }

    /// The name shown in messages: the file's path or the built-in text's name.
    pub fn name(&self) -> String {
        match self {
            Self::File(p) => p.display().to_string(),
            Self::Builtin(b) => b.name.to_string(),
        }
    }
}
