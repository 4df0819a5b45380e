//! Draft sources that run a model: [`SelfDraft`] (the verifying model itself, from the part of it in
//! memory: `--self-draft`) and [`ModelDraft`] (a second, smaller model with the same vocabulary:
//! `--draft MODEL`). Both draft greedily, one token per step, on a KV cache of their own.

use crate::error::{EngineError, Result};
use crate::generate::Engine;
use crate::speculate::DraftSource;
use sampling::argmax;
use transformer::ffn::FfnExecutor;
use transformer::forward::{forward_with_into, FfnMode, KvCache, Logits};

/// The verifying model drafting from memory only: over a neuron store, each draft step computes
/// the units the cache holds (hot and cold) and skips the rest, so drafting never waits for flash
/// ([`offload::ResidentOnly`]); over an expert store, each token's cached experts
/// ([`offload::ExpertResidentOnly`]). Its KV cache copies the verifying model's positions (every token kept
/// so far, [`KvCache::extend_from`]) before each draft, and holds its own only for the drafted
/// tokens, which the next draft forgets.
pub struct SelfDraft<'e, 'a> {
    eng: &'e Engine<'a>,
    cache: KvCache,
    logits: Vec<f32>,
    /// The first error a draft step met, reported at the next [`DraftSource::sync`].
    error: Option<EngineError>,
}

impl<'e, 'a> SelfDraft<'e, 'a> {
    /// A self-draft on `eng`, whose FFN must be over a neuron or expert store (a bundle under a
    /// memory budget): a model in memory has no part cheaper than itself to draft with.
    pub fn new(eng: &'e Engine<'a>) -> Result<Self> {
        let over_store = eng.sparse().and_then(|s| s.resident_only()).is_some();
        if !over_store && eng.experts().is_none() {
            return Err(EngineError::Request(format!(
                "{}: --self-draft drafts with the part of the model in memory, so it needs a \
                 bundle's neuron or expert store (a resident file from `sparrow convert`, under a \
                 memory budget); this model's FFN is all in memory, as cheap as any part of it: \
                 use --lookup N or --draft MODEL",
                eng.model().path().display(),
            )));
        }
        Ok(SelfDraft {
            eng,
            cache: eng.new_cache(),
            logits: Vec::new(),
            error: None,
        })
    }

    fn step(&mut self, token: u32) -> Result<u32> {
        let eng = self.eng;
        // The cached experts of a bundle of experts, else the units in memory of a neuron store.
        let experts = eng.experts().map(|x| x.resident_only());
        let units = match &experts {
            Some(_) => None,
            None => eng.sparse().and_then(|s| s.resident_only()),
        };
        let exec: &dyn FfnExecutor = match (&experts, &units) {
            (Some(x), _) => x,
            (None, Some(u)) => u,
            (None, None) => {
                return Err(EngineError::Request(
                    "--self-draft: the model's FFN is no longer over a store".into(),
                ))
            }
        };
        let mode = FfnMode {
            exec: Some(exec),
            observer: None,
            ffn_nanos: None,
        };
        let precision = eng.options().precision;
        let (cache, logits) = (&mut self.cache, &mut self.logits);
        eng.install(|| {
            forward_with_into(
                eng.model(),
                cache,
                &[token],
                precision,
                Logits::Last,
                mode,
                logits,
            )
        })?;
        Ok(argmax(&self.logits))
    }
}

impl DraftSource for SelfDraft<'_, '_> {
    fn sync(&mut self, target: &KvCache) -> Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        // Positions the target holds are final (a verification step cuts back only its own).
        let keep = self.cache.len().min(target.len());
        self.cache.truncate(keep);
        Ok(self.cache.extend_from(target, target.len())?)
    }

    fn draft(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) {
        // In step: the cache holds the history but its last token.
        if max == 0 || self.error.is_some() || self.cache.len() + 1 != history.len() {
            return;
        }
        let mut next = history[history.len() - 1];
        for _ in 0..max {
            match self.step(next) {
                Ok(t) => next = t,
                Err(e) => {
                    self.error = Some(e);
                    return;
                }
            }
            out.push(next);
        }
    }
}

/// A second model with the same vocabulary drafting greedily on its own KV cache: the history it
/// has not seen yet is run through it (after cutting its cache back to what the history still
/// holds), then one token per drafted token.
pub struct ModelDraft<'e, 'a> {
    eng: &'e Engine<'a>,
    cache: KvCache,
    /// The tokens whose keys and values `cache` holds.
    seen: Vec<u32>,
    logits: Vec<f32>,
    error: Option<EngineError>,
}

impl<'e, 'a> ModelDraft<'e, 'a> {
    /// `draft` drafting for `target`, once their vocabularies are checked to be the same
    /// ([`same_vocabulary`]).
    pub fn new(target: &Engine<'_>, draft: &'e Engine<'a>) -> Result<Self> {
        same_vocabulary(target, draft)?;
        Ok(ModelDraft {
            eng: draft,
            cache: draft.new_cache(),
            seen: Vec::new(),
            logits: Vec::new(),
            error: None,
        })
    }

    fn run(&mut self, tokens: &[u32]) -> Result<u32> {
        self.eng
            .forward_into(&mut self.cache, tokens, Logits::Last, &mut self.logits)?;
        self.seen.extend_from_slice(tokens);
        Ok(argmax(&self.logits))
    }

    fn draft_or_fail(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) -> Result<()> {
        let common = self
            .seen
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count()
            .min(history.len() - 1);
        self.cache.truncate(common);
        self.seen.truncate(common);
        let room = self.cache.capacity().saturating_sub(history.len());
        // As the verifying model ran them: the prompt in one step, later tokens one by one (a
        // draft that is the verifying model then proposes exactly its tokens).
        let (rest, last) = history[common..].split_at(history.len() - common - 1);
        if common == 0 && !rest.is_empty() {
            self.run(rest)?;
        } else {
            for &t in rest {
                self.run(&[t])?;
            }
        }
        let mut next = self.run(last)?;
        out.push(next);
        for _ in 1..max.min(room + 1) {
            next = self.run(&[next])?;
            out.push(next);
        }
        Ok(())
    }
}

impl DraftSource for ModelDraft<'_, '_> {
    fn sync(&mut self, _: &KvCache) -> Result<()> {
        self.error.take().map_or(Ok(()), Err)
    }

    fn draft(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) {
        if max == 0 || history.is_empty() || self.error.is_some() {
            return;
        }
        if let Err(e) = self.draft_or_fail(history, max, out) {
            self.error = Some(e);
        }
    }
}

/// Strings whose token ids two tokenizers must agree on to share a vocabulary.
const PROBES: [&str; 4] = [
    "Hello, world!",
    "def main():\n    return 0\n",
    " the quick brown fox",
    "1234 + 5678 = 6912",
];

/// Refuses a draft model whose vocabulary is not the target's: the same size, and the same ids for
/// a few strings (plain text, code, numbers).
pub fn same_vocabulary(target: &Engine<'_>, draft: &Engine<'_>) -> Result<()> {
    let (a, b) = (target.tokenizer(), draft.tokenizer());
    let (pa, pb) = (target.model().path(), draft.model().path());
    let differ = |what: String| {
        Err(EngineError::Request(format!(
            "--draft {}: its vocabulary is not that of {} ({what}): a draft model must share the \
             model's tokenizer",
            pb.display(),
            pa.display()
        )))
    };
    let (va, vb) = (
        target.model().config.vocab_size,
        draft.model().config.vocab_size,
    );
    if va != vb || a.vocab_size() != b.vocab_size() {
        return differ(format!("{vb} tokens against {va}"));
    }
    for p in PROBES {
        let (ia, ib) = (a.encode(p, false)?, b.encode(p, false)?);
        if ia != ib {
            return differ(format!("{p:?} is {ib:?} against {ia:?}"));
        }
    }
    Ok(())
}

/// A draft source chosen once (by flags, a server's options or a plan) and made anew for each
/// generation ([`Drafting::source`]), with its most drafted tokens per verification step.
#[derive(Clone, Copy)]
pub enum Drafting<'e, 'a> {
    /// Prompt lookup ([`crate::Lookup`]), up to N drafted tokens: `--lookup N`.
    Lookup(usize),
    /// The model from memory only ([`SelfDraft`]): `--self-draft N`.
    SelfDraft(usize),
    /// A second model ([`ModelDraft`]): `--draft MODEL --draft-max N`.
    Model(&'e Engine<'a>, usize),
}

impl std::fmt::Debug for Drafting<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({})", self.name(), self.max_draft())
    }
}

impl<'e, 'a> Drafting<'e, 'a> {
    /// Most tokens drafted per step.
    pub fn max_draft(&self) -> usize {
        match *self {
            Drafting::Lookup(n) | Drafting::SelfDraft(n) | Drafting::Model(_, n) => n,
        }
    }

    /// The same source with at most `n` drafted tokens per step.
    pub fn limited(self, n: usize) -> Self {
        let n = n.min(self.max_draft());
        match self {
            Drafting::Lookup(_) => Drafting::Lookup(n),
            Drafting::SelfDraft(_) => Drafting::SelfDraft(n),
            Drafting::Model(d, _) => Drafting::Model(d, n),
        }
    }

    /// A new draft source for a generation of `eng`; the refusals of [`SelfDraft::new`] and
    /// [`ModelDraft::new`] (so calling it once at start checks that the source can work).
    pub fn source<'s>(&self, eng: &'s Engine<'_>) -> Result<Box<dyn DraftSource + 's>>
    where
        'e: 's,
    {
        Ok(match *self {
            Drafting::Lookup(_) => Box::new(crate::Lookup::default()),
            Drafting::SelfDraft(_) => Box::new(SelfDraft::new(eng)?),
            Drafting::Model(d, _) => Box::new(ModelDraft::new(eng, d)?),
        })
    }

    /// The drafting `plan` chose (`None`: off, or a plan of an older build, which chose nothing).
    pub fn planned(plan: &planner::Plan) -> Option<Self> {
        let c = plan.speculation.as_ref()?;
        let n = c.max_draft as usize;
        match c.source {
            _ if n == 0 => None,
            planner::SpecSource::Off => None,
            planner::SpecSource::Lookup => Some(Drafting::Lookup(n)),
            planner::SpecSource::SelfDraft => Some(Drafting::SelfDraft(n)),
        }
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
