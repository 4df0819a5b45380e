//! The plan's speculation: closed form, the choice from step costs (cheap batched steps speculate,
//! a k-token step that costs k one-token steps does not), plans of older builds still load.

use crate::common;

use common::{device, model};
use planner::speculation::{choose, expected_tokens, lookup, self_draft, Candidate};
use planner::{
    make_plan, Constraints, Plan, Predicted, Solver, SpecAcceptance, SpecSource, PLAN_KIND,
    PLAN_VERSION,
};

/// Batch size 1's step takes 10 ms (attention 2, FFN 3, I/O 8); a step of `b` tokens `cost(b)`
/// one-token steps.
fn steps(cost: impl Fn(u32) -> f64) -> Vec<Predicted> {
    [1, 2, 4, 8]
        .iter()
        .map(|&b| Predicted {
            batch: b,
            sparse: true,
            threads: 2,
            attn_s: 0.002,
            pred_s: 0.0,
            ffn_s: 0.003,
            io_s: 0.008,
            decode_s: 0.010 * cost(b),
            tok_s: b as f64 / (0.010 * cost(b)),
        })
        .collect()
}

#[test]
fn expected_tokens_is_the_geometric_sum() {
    assert_eq!(expected_tokens(4, 0.0), 1.0);
    assert_eq!(expected_tokens(4, 1.0), 5.0);
    // 1 + a + a^2 + a^3
    let a: f64 = 0.6;
    let sum = 1.0 + a + a * a + a * a * a;
    assert!((expected_tokens(3, a) - sum).abs() < 1e-12);
}

#[test]
fn cheap_steps_speculate_and_steps_that_cost_k_one_token_steps_do_not() {
    let free = [lookup(None)];
    // Reads dominate: a step of b tokens reads what one does, plus a little compute.
    let cheap = steps(|b| 1.0 + 0.05 * (b - 1) as f64);
    let c = choose(&cheap, &free);
    assert_eq!(c.source, SpecSource::Lookup);
    assert!(c.max_draft >= 1 && c.gain > 1.0 && !c.measured, "{c:?}");
    assert!((c.acceptance - planner::speculation::LOOKUP_ACCEPTANCE).abs() < 1e-12);
    // Each token costs a whole step: E(k, a) < k + 1, never a gain.
    let linear = steps(|b| b as f64);
    let c = choose(&linear, &free);
    assert_eq!((c.source, c.max_draft, c.gain), (SpecSource::Off, 0, 1.0));
    // Perfect drafts break even at best: still off.
    let sure = Candidate {
        acceptance: 1.0,
        ..free[0]
    };
    assert_eq!(choose(&linear, &[sure]).source, SpecSource::Off);
    // No batch size above 1 priced: off.
    assert_eq!(choose(&cheap[..1], &free).source, SpecSource::Off);
    // A better acceptance drafts further.
    let good = choose(&cheap, &[lookup(Some(0.9))]);
    assert!(
        good.max_draft >= c_draft(&cheap, 0.5) && good.measured,
        "{good:?}"
    );
}

fn c_draft(p: &[Predicted], a: f64) -> u32 {
    choose(p, &[lookup(Some(a))]).max_draft
}

#[test]
fn a_self_draft_pays_for_its_draft_steps() {
    let cheap = steps(|b| 1.0 + 0.05 * (b - 1) as f64);
    // Half the FFN cached: a draft token costs (2 + 1.5) ms of a 10 ms step, half its drafts kept.
    let sd = self_draft(&cheap[0], 0.5, None);
    assert!(
        (sd.draft_cost - 0.35).abs() < 1e-9 && sd.acceptance == 0.5,
        "{sd:?}"
    );
    let c = choose(&cheap, &[sd]);
    assert_eq!(c.source, SpecSource::SelfDraft);
    // By hand: k = 1 gives 1.5 / (1.05 + 0.35) = 1.07; k = 3 gives 1.875 / (1.15 + 1.05) = 0.85.
    assert_eq!(c.max_draft, 1, "{c:?}");
    assert!((c.gain - 1.5 / 1.4).abs() < 1e-9, "{c:?}");
    // Lookup, drafting for free at the same acceptance, wins over it.
    let both = choose(&cheap, &[sd, lookup(Some(0.5))]);
    assert_eq!(both.source, SpecSource::Lookup);
}

#[test]
fn a_measured_acceptance_decides_the_plans_speculation() {
    let m = model(2, 32, 4, 1.0, true);
    let plan = |lookup: Option<f64>| {
        let c = Constraints {
            memory_budget: Some(64 << 20),
            context: 256,
            spec_acceptance: SpecAcceptance {
                lookup,
                self_draft: None,
            },
            ..Constraints::default()
        };
        make_plan(&device(2, 1.0), &m, &c, Solver::Search).unwrap()
    };
    let default = plan(None).speculation.unwrap();
    assert!(!default.measured, "{default:?}");
    // Drafts nearly always kept: lookup, as far as the priced batch sizes go, marked measured.
    let p = plan(Some(0.95));
    let good = p.speculation.clone().unwrap();
    assert_eq!(good.source, SpecSource::Lookup, "{good:?}");
    assert!(
        good.measured && (good.acceptance - 0.95).abs() < 1e-12,
        "{good:?}"
    );
    assert_eq!(good, choose(&p.predicted, &[lookup(Some(0.95))]));
    assert!(good.gain > default.gain, "{good:?} {default:?}");
    assert!(
        p.describe().contains("95% of drafts kept, measured"),
        "{}",
        p.describe()
    );
    // Drafts never kept: no speculation pays.
    let never = plan(Some(0.0)).speculation.unwrap();
    assert_eq!(never.source, SpecSource::Off, "{never:?}");
    // Not a number: the default, unmeasured.
    let nan = plan(Some(f64::NAN)).speculation.unwrap();
    assert_eq!(nan, default);
}

#[test]
fn plans_carry_a_choice_and_plans_of_older_builds_load_without_one() {
    let m = model(2, 32, 4, 1.0, true);
    let c = Constraints {
        memory_budget: Some(64 << 20),
        context: 256,
        ..Constraints::default()
    };
    let p = make_plan(&device(2, 1.0), &m, &c, Solver::Search).unwrap();
    let s = p.speculation.clone().expect("a new plan chooses");
    let by_hand = choose(&p.predicted, &[lookup(None)]);
    assert!(s.gain >= by_hand.gain, "{s:?} {by_hand:?}");
    assert!(p.describe().contains("speculation: "), "{}", p.describe());
    // The same plan as an older build wrote it: no `speculation` field.
    let mut v = serde_json::to_value(&p).unwrap();
    v.as_object_mut().unwrap().remove("speculation");
    let payload = serde_json::to_vec_pretty(&v).unwrap();
    let mut bytes = format!(
        "{PLAN_KIND} v{PLAN_VERSION} len={} fnv1a64={:016x}\n",
        payload.len(),
        planner::fnv1a64(&payload)
    )
    .into_bytes();
    bytes.extend_from_slice(&payload);
    bytes.push(b'\n');
    let dir = std::env::temp_dir().join(format!("planner-spec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("old.plan");
    std::fs::write(&path, bytes).unwrap();
    let old = Plan::load(&path).unwrap();
    assert_eq!(old.speculation, None);
    assert_eq!(
        Plan {
            speculation: Some(s),
            ..old
        },
        p
    );
}
