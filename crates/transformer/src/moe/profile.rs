//! [`RoutingProfile`]: which experts a model's routers pick on calibration text (per layer, how often
//! each expert is selected and how often a token reuses an expert of the token before it), the
//! profile an expert bundle carries; and [`RoutingRecorder`], which measures it while the in-memory
//! model runs.
//!
//! File format (text, one line each): `sparrow-routing-profile 1`, then
//! `model <fingerprint> layers <L> experts <E> tokens <T>`, then per layer
//! `layer <l> reused <R> counts <c_0> ... <c_{E-1}>`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use kernels_neon::QMatrix;

use super::routing::Route;
use crate::error::{ModelError, Result};

/// Largest routing profile read (a 128-layer, 1024-expert profile is a few MiB).
pub const MAX_ROUTING_PROFILE_BYTES: u64 = 64 << 20;

const MAGIC_LINE: &str = "sparrow-routing-profile 1";

/// Routing statistics of a model on some text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingProfile {
    /// Fingerprint of the model measured (`engine::fingerprint`'s `model_fingerprint`).
    pub model_fingerprint: u64,
    /// Tokens routed per layer.
    pub tokens: u64,
    /// Per layer, per expert: how many tokens selected it.
    pub counts: Vec<Vec<u64>>,
    /// Per layer: selections of an expert that the previous token (of the same step) selected too.
    pub reused: Vec<u64>,
}

impl RoutingProfile {
    /// Share of the tokens that selected expert `e` of layer `l`.
    pub fn freq(&self, l: usize, e: usize) -> f64 {
        let c = self.counts.get(l).and_then(|c| c.get(e)).copied();
        c.unwrap_or(0) as f64 / self.tokens.max(1) as f64
    }

    /// The experts of layer `l`, most selected first (ties to the lower index).
    pub fn ranked(&self, l: usize) -> Vec<u32> {
        let Some(c) = self.counts.get(l) else {
            return Vec::new();
        };
        let mut v: Vec<u32> = (0..c.len() as u32).collect();
        v.sort_by(|&a, &b| c[b as usize].cmp(&c[a as usize]).then(a.cmp(&b)));
        v
    }

    /// The file's text.
    pub fn to_text(&self) -> String {
        let experts = self.counts.first().map_or(0, Vec::len);
        let mut s = format!(
            "{MAGIC_LINE}\nmodel {:016x} layers {} experts {experts} tokens {}\n",
            self.model_fingerprint,
            self.counts.len(),
            self.tokens
        );
        for (l, (c, r)) in self.counts.iter().zip(&self.reused).enumerate() {
            s.push_str(&format!("layer {l} reused {r} counts"));
            c.iter().for_each(|v| s.push_str(&format!(" {v}")));
            s.push('\n');
        }
        s
    }

    /// Parses a profile read from `path` (named in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let bad = |what: String| ModelError::BadModel {
            path: path.to_path_buf(),
            detail: format!("not a valid routing profile: {what}"),
        };
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC_LINE) {
            return Err(bad(format!("the first line is not `{MAGIC_LINE}`")));
        }
        let head: Vec<&str> = lines.next().unwrap_or("").split(' ').collect();
        let (fp, layers, experts, tokens) = match head.as_slice() {
            ["model", fp, "layers", l, "experts", e, "tokens", t] => (
                u64::from_str_radix(fp, 16).ok(),
                l.parse::<usize>().ok(),
                e.parse::<usize>().ok(),
                t.parse::<u64>().ok(),
            ),
            _ => (None, None, None, None),
        };
        let (Some(fp), Some(layers), Some(experts), Some(tokens)) = (fp, layers, experts, tokens)
        else {
            return Err(bad(
                "the second line is not `model .. layers .. experts .. tokens ..`".into(),
            ));
        };
        let (mut counts, mut reused) = (Vec::new(), Vec::new());
        for (l, line) in lines.enumerate() {
            let w: Vec<&str> = line.split(' ').collect();
            let ok = w.len() == 5 + experts
                && w[0] == "layer"
                && w[1] == l.to_string()
                && w[2] == "reused"
                && w[4] == "counts";
            let nums: Option<Vec<u64>> = w
                .get(5..)
                .and_then(|n| n.iter().map(|v| v.parse().ok()).collect());
            match (ok, w.get(3).and_then(|r| r.parse::<u64>().ok()), nums) {
                (true, Some(r), Some(c)) if c.iter().all(|&v| v <= tokens) => {
                    reused.push(r);
                    counts.push(c);
                }
                _ => {
                    return Err(bad(format!(
                        "line {} is not layer {l} of {experts} experts",
                        l + 3
                    )))
                }
            }
            if counts.len() > layers {
                break;
            }
        }
        if counts.len() != layers {
            return Err(bad(format!(
                "{} layers listed, the header says {layers}",
                counts.len()
            )));
        }
        Ok(RoutingProfile {
            model_fingerprint: fp,
            tokens,
            counts,
            reused,
        })
    }

    /// Writes the profile to `path` (whole or not at all).
    pub fn save(&self, path: &Path) -> Result<()> {
        atomic_out::write_atomic(path, self.to_text().as_bytes())?;
        Ok(())
    }

    /// Reads the profile at `path`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = atomic_out::read_bounded_text(path, MAX_ROUTING_PROFILE_BYTES)?;
        Self::parse(&text, path)
    }
}

/// One recording: the routers it watches (by the address of their bytes in the mapping, so another
/// model running at the same time is not counted) and what it counted.
struct Recording {
    id: u64,
    routers: Vec<usize>,
    counts: Vec<Vec<u64>>,
    reused: Vec<u64>,
    tokens: Vec<u64>,
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static RECORDINGS: Mutex<Vec<Recording>> = Mutex::new(Vec::new());

/// Measures a [`RoutingProfile`] while the model it was started for runs in memory: every MoE step
/// of that model counts its routes until [`RoutingRecorder::finish`].
#[derive(Debug)]
pub struct RoutingRecorder {
    id: u64,
    fingerprint: u64,
}

impl RoutingRecorder {
    /// Starts counting the routes of the MoE layers whose routers' bytes start at `routers` (in layer
    /// order; the model's fingerprint is `fingerprint`), each of `n_experts` experts.
    pub fn start(routers: Vec<usize>, n_experts: usize, fingerprint: u64) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let n = routers.len();
        let mut all = RECORDINGS.lock().unwrap_or_else(|e| e.into_inner());
        all.push(Recording {
            id,
            routers,
            counts: vec![vec![0; n_experts]; n],
            reused: vec![0; n],
            tokens: vec![0; n],
        });
        ACTIVE.store(true, Ordering::Release);
        RoutingRecorder { id, fingerprint }
    }

    /// Stops counting and returns the profile.
    pub fn finish(self) -> RoutingProfile {
        let mut all = RECORDINGS.lock().unwrap_or_else(|e| e.into_inner());
        let r = all
            .iter()
            .position(|r| r.id == self.id)
            .map(|i| all.swap_remove(i));
        ACTIVE.store(!all.is_empty(), Ordering::Release);
        let r = r.expect("a recording lives until finished");
        RoutingProfile {
            model_fingerprint: self.fingerprint,
            tokens: r.tokens.iter().copied().max().unwrap_or(0),
            counts: r.counts,
            reused: r.reused,
        }
    }
}

/// Counts one MoE step's routes (`k` per token, token-major) for the recording watching `router`.
pub(crate) fn note(router: &QMatrix<'_>, routes: &[Route], k: usize) {
    if !ACTIVE.load(Ordering::Acquire) || k == 0 {
        return;
    }
    let at = router.data().as_ptr() as usize;
    let mut all = RECORDINGS.lock().unwrap_or_else(|e| e.into_inner());
    for r in all.iter_mut() {
        let Some(l) = r.routers.iter().position(|&p| p == at) else {
            continue;
        };
        let mut prev: &[Route] = &[];
        for tok in routes.chunks(k) {
            for route in tok {
                if let Some(c) = r.counts[l].get_mut(route.expert as usize) {
                    *c += 1;
                }
                if prev.iter().any(|p| p.expert == route.expert) {
                    r.reused[l] += 1;
                }
            }
            prev = tok;
        }
        r.tokens[l] += (routes.len() / k) as u64;
    }
}
