//! A trace of speculative decoding for people reading it (`SPARROW_SPEC_TRACE=1`): after each
//! generation, on standard error, the generated text with every verification step marked, so one can
//! see where the drafts were kept and where they were rejected.
//!
//! Each step is written as `[kept drafts]token`: the drafted tokens it kept between brackets, then
//! the token the model chose after them (a correction, or the bonus token after a fully kept draft).
//! When a draft was rejected, the drafted tokens that were not kept follow as `{~rejected}`. A step
//! that drafted nothing is just its token. Tokens are decoded one by one (a character split over two
//! tokens may show as replacement characters).

use model_tokenizer::Tokenizer;

use crate::spec_stats::SpecStats;

/// The environment variable that turns the trace on (any value but empty or `0`).
pub const TRACE_ENV: &str = "SPARROW_SPEC_TRACE";

/// One generation's trace (nothing is recorded when the trace is off).
pub(crate) struct Trace<'t> {
    tok: &'t Tokenizer,
    text: Option<String>,
    /// With `SPARROW_SPEC_TRACE=ids`: the prompt's and the output's token ids are written too (one
    /// JSON line each, to replay draft policies against the output offline).
    ids: bool,
}

impl<'t> Trace<'t> {
    /// A trace that records when [`TRACE_ENV`] says so.
    pub fn from_env(tok: &'t Tokenizer) -> Self {
        let v = std::env::var(TRACE_ENV).unwrap_or_default();
        let on = !v.is_empty() && v != "0";
        Trace {
            tok,
            text: on.then(String::new),
            ids: v == "ids",
        }
    }

    /// Whether the trace records.
    pub fn on(&self) -> bool {
        self.text.is_some()
    }

    fn piece(&self, ids: &[u32]) -> String {
        self.tok
            .decode(ids, false)
            .unwrap_or_else(|_| format!("{ids:?}"))
    }

    /// One verification step: `draft` was proposed, `chosen` are the tokens the step added to the
    /// output (its kept drafts, then at most one more).
    pub fn step(&mut self, draft: &[u32], chosen: &[u32]) {
        if !self.on() {
            return;
        }
        let kept = draft.iter().zip(chosen).take_while(|(d, c)| d == c).count();
        let mut s = String::new();
        if kept > 0 {
            s += &format!("[{}]", self.piece(&chosen[..kept]));
        }
        s += &self.piece(&chosen[kept..]);
        if kept < draft.len() {
            s += &format!("{{~{}}}", self.piece(&draft[kept..]));
        }
        if let Some(t) = self.text.as_mut() {
            t.push_str(&s);
        }
    }

    /// Writes the trace with the generation's counts to standard error.
    pub fn finish(&self, stats: &SpecStats, prompt: &[u32], generated: &[u32]) {
        if self.ids {
            eprintln!("spec-ids {{\"prompt\": {prompt:?}, \"generated\": {generated:?}}}");
        }
        if let Some(t) = &self.text {
            eprintln!(
                "--- speculation trace: {} steps, {} drafted, {} kept ({:.2} tokens per step)\n{t}\n---",
                stats.steps,
                stats.drafted,
                stats.accepted,
                stats.tokens_per_step()
            );
        }
    }
}
