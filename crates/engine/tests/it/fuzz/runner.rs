//! Runs one fuzz target: mutated seeds, each case under `catch_unwind`, within a case count and a
//! time budget; panics (and cases slower than [`SLOW`]) are findings, saved for regression tests.

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::{Duration, Instant};

use super::mutator::{mutate, Rng};

/// A case: named files (one for most targets; an HF directory has several).
pub type Case = Vec<(String, Vec<u8>)>;

/// One parser under test.
pub struct Target {
    /// Short name (reports, finding folders, the RNG stream).
    pub name: &'static str,
    /// Valid inputs the cases are mutated from (each also runs unmutated first).
    pub seeds: Vec<Case>,
    /// Format tokens for the mutator (see [`mutate`]).
    pub dict: &'static [&'static [u8]],
    /// Repairs checksums after a mutation (applied to half the cases, so the parser behind the
    /// checksum is reached too): `(file name, bytes)`.
    pub fixup: Option<fn(&str, &mut [u8])>,
    /// Parses the case whose files were written into the directory: `Ok` or `Err`, never a panic.
    #[allow(clippy::type_complexity)]
    pub run: Box<dyn Fn(&Path) -> Result<(), String>>,
}

/// Limits of a round, from the environment.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Cases per target (`SPARROW_FUZZ_CASES`).
    pub cases: u64,
    /// Time per target (`SPARROW_FUZZ_TIME`, seconds).
    pub time: Duration,
    /// RNG seed of the round (`SPARROW_FUZZ_SEED`).
    pub seed: u64,
}

impl Limits {
    /// Defaults keep a CI round well under a minute: 1500 cases or 5 s per target.
    pub fn from_env() -> Limits {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Limits {
            cases: var("SPARROW_FUZZ_CASES")
                .map_or(1500, |v| v.parse().expect("SPARROW_FUZZ_CASES")),
            time: Duration::from_secs_f64(
                var("SPARROW_FUZZ_TIME").map_or(5.0, |v| v.parse().expect("SPARROW_FUZZ_TIME")),
            ),
            seed: var("SPARROW_FUZZ_SEED")
                .map_or(0x5eed, |v| v.parse().expect("SPARROW_FUZZ_SEED")),
        }
    }
}

/// A case that panicked or ran too long.
#[derive(Debug)]
pub struct Finding {
    /// What happened (the panic message and place, or the time taken).
    pub what: String,
    /// Where the case's files were saved.
    pub saved: PathBuf,
}

/// What a target's round did.
#[derive(Debug, Default)]
pub struct Report {
    /// Cases run.
    pub execs: u64,
    /// Cases the parser accepted.
    pub ok: u64,
    /// Cases the parser refused with an error.
    pub err: u64,
    /// Wall time.
    pub secs: f64,
    /// Slowest case.
    pub slowest: Duration,
    /// Panics and slow cases.
    pub findings: Vec<Finding>,
}

/// A single case slower than this is a finding (a hang or an unbounded loop in small input).
pub const SLOW: Duration = Duration::from_secs(2);

thread_local! {
    static FUZZING: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Panics on a fuzzing thread are recorded instead of printed; others go to the default hook.
fn install_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if FUZZING.with(Cell::get) {
                let msg = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(non-string panic)".into());
                let place = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("panic at {place}: {msg}")));
            } else {
                default(info);
            }
        }));
    });
}

/// Writes `case` into `dir`, removing files of an earlier case that this one lacks.
pub fn write_case(dir: &Path, case: &Case) {
    std::fs::create_dir_all(dir).expect("case directory");
    for old in std::fs::read_dir(dir).expect("case directory").flatten() {
        if !case.iter().any(|(n, _)| old.file_name() == n.as_str()) {
            std::fs::remove_file(old.path()).expect("stale case file");
        }
    }
    for (name, bytes) in case {
        std::fs::write(dir.join(name), bytes).expect("case file");
    }
}

/// FNV-1a 64 of the case, naming its saved copy.
fn digest(case: &Case) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (name, bytes) in case {
        for &b in name.as_bytes().iter().chain(bytes) {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

/// Runs `t` for `limits`, working in `work` (cases are written to `work/<name>/case`, findings
/// saved to `work/findings/<name>-<digest>/`).
pub fn run_target(t: &Target, limits: Limits, work: &Path) -> Report {
    install_hook();
    let mut seed = limits.seed;
    for b in t.name.bytes() {
        seed = (seed ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    let mut rng = Rng::new(seed);
    let dir = work.join(t.name).join("case");
    let mut report = Report::default();
    let start = Instant::now();
    let mut i = 0u64;
    while report.execs < limits.cases && start.elapsed() < limits.time {
        let s = (i as usize) % t.seeds.len();
        let mut case = t.seeds[s].clone();
        if i >= t.seeds.len() as u64 {
            let f = rng.below(case.len());
            let (name, bytes) = &mut case[f];
            mutate(bytes, &mut rng, t.dict);
            if let Some(fix) = t.fixup {
                if rng.one_in(2) {
                    fix(name, bytes.as_mut_slice());
                }
            }
        }
        i += 1;
        write_case(&dir, &case);
        FUZZING.with(|f| f.set(true));
        let t0 = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| (t.run)(&dir)));
        let took = t0.elapsed();
        FUZZING.with(|f| f.set(false));
        report.execs += 1;
        report.slowest = report.slowest.max(took);
        let what = match result {
            Ok(Ok(())) => {
                report.ok += 1;
                (took > SLOW).then(|| format!("slow: {took:?}"))
            }
            Ok(Err(_)) => {
                report.err += 1;
                (took > SLOW).then(|| format!("slow: {took:?}"))
            }
            Err(_) => Some(
                LAST_PANIC
                    .with(|p| p.borrow_mut().take())
                    .unwrap_or_else(|| "panic".into()),
            ),
        };
        if let Some(what) = what {
            let saved = work
                .join("findings")
                .join(format!("{}-{:016x}", t.name, digest(&case)));
            write_case(&saved, &case);
            report.findings.push(Finding { what, saved });
        }
    }
    report.secs = start.elapsed().as_secs_f64();
    report
}
