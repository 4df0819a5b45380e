//! The draft sources of speculative decoding as `run` and `bench` take them: `--lookup N`,
//! `--self-draft[=N]`, `--draft MODEL` (with `--draft-max N`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use engine::{DraftSource, Engine, Lookup, ModelDraft, ModelFile, SelfDraft};

/// Flags choosing a draft source (at most one).
#[derive(Args, Clone, Debug, Default)]
pub struct SpecArgs {
    /// Speculative decoding with the model itself as the draft, from the part of it in memory
    /// only (hot and cached neurons of a bundle under a memory budget; nothing read from flash
    /// while drafting): draft up to N tokens (default 4) greedily, verify them in one step. Greedy
    /// output is unchanged. Refused for a model all in memory.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "4", value_parser = crate::parse::lookup, conflicts_with_all = ["lookup", "draft"])]
    pub self_draft: Option<usize>,
    /// Speculative decoding with a second, smaller model with the same vocabulary (checked) as
    /// the draft: up to --draft-max tokens a step, drafted greedily. Greedy output is unchanged.
    #[arg(long, value_name = "MODEL", conflicts_with = "lookup")]
    pub draft: Option<PathBuf>,
    /// With --draft: most tokens drafted per verification step.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = crate::parse::lookup, requires = "draft")]
    pub draft_max: usize,
}

impl SpecArgs {
    /// The draft model's file, opened.
    pub fn open_draft(&self) -> Result<Option<ModelFile>> {
        self.draft
            .as_ref()
            .map(|p| ModelFile::open(p).with_context(|| format!("--draft {}", p.display())))
            .transpose()
    }
}

/// A draft source chosen by the flags, with its most drafted tokens.
#[derive(Clone, Copy)]
pub enum Drafting<'e, 'a> {
    /// `--lookup N`.
    Lookup(usize),
    /// `--self-draft N`.
    SelfDraft(usize),
    /// `--draft MODEL --draft-max N`.
    Model(&'e Engine<'a>, usize),
}

impl<'e, 'a> Drafting<'e, 'a> {
    /// The drafting `lookup` and `s` ask for, `draft` the engine of `s.draft` (if given).
    pub fn of(lookup: Option<usize>, s: &SpecArgs, draft: Option<&'e Engine<'a>>) -> Option<Self> {
        if let Some(n) = lookup {
            return Some(Drafting::Lookup(n));
        }
        if let Some(n) = s.self_draft {
            return Some(Drafting::SelfDraft(n));
        }
        draft.map(|d| Drafting::Model(d, s.draft_max))
    }

    /// Most tokens drafted per step.
    pub fn max_draft(&self) -> usize {
        match *self {
            Drafting::Lookup(n) | Drafting::SelfDraft(n) | Drafting::Model(_, n) => n,
        }
    }

    /// A new draft source for a generation of `eng`.
    pub fn source<'s>(&self, eng: &'s Engine<'_>) -> engine::Result<Box<dyn DraftSource + 's>>
    where
        'e: 's,
    {
        Ok(match *self {
            Drafting::Lookup(_) => Box::new(Lookup::default()),
            Drafting::SelfDraft(_) => Box::new(SelfDraft::new(eng)?),
            Drafting::Model(d, _) => Box::new(ModelDraft::new(eng, d)?),
        })
    }

    /// The flag's name, for reports.
    pub fn name(&self) -> &'static str {
        match self {
            Drafting::Lookup(_) => "lookup",
            Drafting::SelfDraft(_) => "self-draft",
            Drafting::Model(..) => "draft",
        }
    }
}
