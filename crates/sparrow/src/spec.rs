//! The draft sources of speculative decoding as `run`, `bench` and `serve` take them: `--lookup N`,
//! `--self-draft[=N]`, `--draft MODEL` (with `--draft-max N`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use engine::{Engine, ModelFile};

/// Flags choosing a draft source (at most one).
#[derive(Args, Clone, Debug, Default)]
pub struct SpecArgs {
    /// Speculative decoding with the model itself as the draft, from the part of it in memory
    /// only (hot and cached neurons, or cached experts, of a bundle under a memory budget; nothing
    /// read from flash while drafting): draft up to N tokens (default 4) greedily, verify them in one step. Greedy
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
    /// Do not speculate where the plan (--plan, or the one made for --memory-budget) chose to
    /// (`run` and `serve` draft as the plan says when no flag of speculation is given; `bench`
    /// never does).
    #[arg(long, conflicts_with_all = ["lookup", "self_draft", "draft"])]
    pub no_speculation: bool,
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

/// The draft model's engine over `file` (opened by [`SpecArgs::open_draft`]), with the options of
/// the engine `eng` it drafts for.
pub fn draft_engine<'f>(
    file: Option<&'f ModelFile>,
    eng: &Engine<'_>,
) -> Result<Option<Engine<'f>>> {
    Ok(file
        .map(|f| Engine::new(f, eng.options().clone()))
        .transpose()?)
}

/// A draft source chosen by the flags, with its most drafted tokens.
pub use engine::Drafting;

/// The drafting `lookup` and `s` ask for, `draft` the engine of `s.draft` (if given).
pub fn drafting<'e, 'a>(
    lookup: Option<usize>,
    s: &SpecArgs,
    draft: Option<&'e Engine<'a>>,
) -> Option<Drafting<'e, 'a>> {
    if let Some(n) = lookup {
        return Some(Drafting::Lookup(n));
    }
    if let Some(n) = s.self_draft {
        return Some(Drafting::SelfDraft(n));
    }
    draft.map(|d| Drafting::Model(d, s.draft_max))
}

/// [`drafting`], else the plan's choice (unless `--no-speculation`), where it can work with `eng`
/// (a self-draft needs a neuron store; otherwise the plan's choice is dropped with a note).
pub fn drafting_or_planned<'e, 'a>(
    lookup: Option<usize>,
    s: &SpecArgs,
    draft: Option<&'e Engine<'a>>,
    plan: Option<&engine::Plan>,
    eng: &Engine<'_>,
) -> Option<Drafting<'e, 'a>> {
    if let Some(d) = drafting(lookup, s, draft) {
        return Some(d);
    }
    let d = Drafting::planned(plan?).filter(|_| !s.no_speculation)?;
    match d.source(eng) {
        Ok(_) => Some(d),
        Err(e) => {
            eprintln!("note: not speculating as the plan chose: {e}");
            None
        }
    }
}
