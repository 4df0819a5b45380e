//! The cost model handed to Z3's optimizer, exactly as the tables state it: integer variables for
//! the thread and queue-depth choices and each layer's cache step, booleans for each layer's
//! sparse FFN and for each tensor kept in memory; `T_decode` and memory as if-then-else lookups into the tables; minimize
//! `T_decode`, then memory, subject to memory <= budget.

use z3::ast::{Bool, Int};
use z3::{Optimize, SatResult};

use crate::error::{PlannerError, Result};
use crate::solve::{Choice, Cost};
use crate::tables::Tables;

fn int(v: u64) -> Int {
    Int::from_i64(v.min(i64::MAX as u64) as i64)
}

/// `values[index]` as a chain of if-then-else.
fn lookup(index: &Int, values: &[u64]) -> Int {
    let mut e = int(*values.last().expect("non-empty table"));
    for (i, &v) in values.iter().enumerate().rev().skip(1) {
        e = index.eq(Int::from_i64(i as i64)).ite(&int(v), &e);
    }
    e
}

fn in_range(x: &Int, n: usize) -> Bool {
    Bool::and(&[x.ge(Int::from_i64(0)), x.lt(Int::from_i64(n as i64))])
}

/// The solver's variables: thread and queue-depth indices, and per layer its sparse flag and cache
/// step, per tensor whether it stays in memory.
struct Vars {
    ti: Int,
    qi: Int,
    sparse: Vec<Bool>,
    steps: Vec<Int>,
    res: Vec<Bool>,
}

/// Declares the variables and asserts their domains.
fn declare(opt: &Optimize, t: &Tables) -> Vars {
    let ti = Int::new_const("threads");
    let qi = Int::new_const("queue_depth");
    let sparse: Vec<Bool> = (0..t.layers())
        .map(|l| Bool::new_const(format!("sparse_{l}")))
        .collect();
    let steps: Vec<Int> = (0..t.layers())
        .map(|l| Int::new_const(format!("step_{l}")))
        .collect();
    let res: Vec<Bool> = (0..t.tensors.len())
        .map(|i| Bool::new_const(format!("resident_{i}")))
        .collect();
    opt.assert(in_range(&ti, t.threads.len()));
    opt.assert(in_range(&qi, t.queue_depths.len()));
    for s in &steps {
        opt.assert(in_range(s, t.grid as usize + 1));
    }
    for (r, x) in res.iter().zip(&t.tensors) {
        if !x.2 {
            opt.assert(r);
        }
    }
    // A layer holds every neuron unless it is sparse over a store; a store's layers are alike.
    for (s, step) in sparse.iter().zip(&steps) {
        let full = step.eq(Int::from_i64(t.grid as i64));
        if t.offloaded {
            opt.assert(Bool::or(&[s.clone(), full]));
            opt.assert(s.eq(&sparse[0]));
        } else {
            opt.assert(full);
        }
    }
    Vars {
        ti,
        qi,
        sparse,
        steps,
        res,
    }
}

/// The sum of `terms`, zero when there are none.
fn sum(terms: Vec<Int>) -> Int {
    if terms.is_empty() {
        Int::from_i64(0)
    } else {
        Int::add(&terms)
    }
}

/// `T_decode`: attention (plus the streamed tensors), predictors, and the larger of FFN compute and
/// flash reads.
fn decode_expr(t: &Tables, v: &Vars) -> Int {
    let zero = Int::from_i64(0);
    let stream: Vec<Int> = v
        .res
        .iter()
        .zip(&t.tensors)
        .map(|(r, x)| r.ite(&zero, &int(x.1)))
        .collect();
    let attn = Int::add(&[vec![lookup(&v.ti, &t.attn_ns)], stream].concat());
    // Layer `l`'s column of a per-thread, per-layer table.
    let column = |table: &[Vec<u64>], l: usize| table.iter().map(|r| r[l]).collect::<Vec<u64>>();
    let pred = sum(v
        .sparse
        .iter()
        .enumerate()
        .map(|(l, s)| s.ite(&lookup(&v.ti, &column(&t.pred_ns, l)), &zero))
        .collect());
    let ffn = sum(v
        .sparse
        .iter()
        .enumerate()
        .map(|(l, s)| {
            s.ite(
                &lookup(&v.ti, &column(&t.ffn_sparse_ns, l)),
                &lookup(&v.ti, &column(&t.ffn_dense_ns, l)),
            )
        })
        .collect());
    let io_terms: Vec<Int> = v
        .steps
        .iter()
        .enumerate()
        .map(|(l, s)| {
            let per_q: Vec<Int> = (0..t.queue_depths.len())
                .map(|q| lookup(s, &t.io_ns[q][l]))
                .collect();
            let mut e = per_q.last().expect("a queue depth").clone();
            for (q, x) in per_q.iter().enumerate().rev().skip(1) {
                e = v.qi.eq(Int::from_i64(q as i64)).ite(x, &e);
            }
            e
        })
        .collect();
    let io = sum(io_terms);
    Int::add(&[attn, pred, ffn.ge(&io).ite(&ffn, &io)])
}

/// Memory: the fixed bytes, the sparse layers' predictors, the resident tensors and the caches.
fn memory_expr(t: &Tables, v: &Vars) -> Int {
    let zero = Int::from_i64(0);
    let mut mem_terms = vec![int(t.fixed_bytes)];
    mem_terms.extend(
        v.sparse
            .iter()
            .zip(&t.pred_bytes)
            .map(|(s, &b)| s.ite(&int(b), &zero)),
    );
    mem_terms.extend(
        v.res
            .iter()
            .zip(&t.tensors)
            .map(|(r, x)| r.ite(&int(x.0), &zero)),
    );
    mem_terms.extend(
        v.steps
            .iter()
            .enumerate()
            .map(|(l, s)| lookup(s, &t.cache_bytes[l])),
    );
    Int::add(&mem_terms)
}

/// The configuration Z3's model gives the variables.
fn read_choice(model: &z3::Model, v: &Vars) -> Result<Choice> {
    let get_bool = |x: &Bool| -> Result<bool> {
        model
            .eval(x, true)
            .and_then(|b| b.as_bool())
            .ok_or_else(|| PlannerError::Solver("a variable has no value".into()))
    };
    Ok(Choice {
        threads: get_int(model, &v.ti)? as usize,
        queue_depth: get_int(model, &v.qi)? as usize,
        sparse: v.sparse.iter().map(get_bool).collect::<Result<_>>()?,
        steps: v
            .steps
            .iter()
            .map(|s| get_int(model, s).map(|x| x as u32))
            .collect::<Result<_>>()?,
        resident: v.res.iter().map(get_bool).collect::<Result<_>>()?,
    })
}

/// The value Z3's model gives `x`.
fn get_int(model: &z3::Model, x: &Int) -> Result<i64> {
    model
        .eval(x, true)
        .and_then(|v| v.as_i64())
        .ok_or_else(|| PlannerError::Solver("a variable has no value".into()))
}

/// Solves the tables exactly with Z3: the fastest configuration within `budget`, ties broken by
/// less memory, then by the deeper queue (the same order as `search` and `brute_force`).
pub fn solve_z3(t: &Tables, budget: u64) -> Result<(Choice, Cost)> {
    let opt = Optimize::new();
    let v = declare(&opt, t);
    let decode = decode_expr(t, &v);
    let memory = memory_expr(t, &v);
    opt.assert(memory.le(int(budget)));
    opt.minimize(&decode);
    opt.minimize(&memory);
    opt.maximize(&v.qi);
    match opt.check(&[]) {
        SatResult::Sat => {}
        SatResult::Unsat => {
            return Err(PlannerError::Infeasible(format!(
                "no configuration fits {:.1} MiB (the smallest needs {:.1} MiB)",
                budget as f64 / 1048576.0,
                t.min_memory() as f64 / 1048576.0
            )))
        }
        SatResult::Unknown => {
            return Err(PlannerError::Solver(format!(
                "unknown: {}",
                opt.get_reason_unknown().unwrap_or_default()
            )))
        }
    }
    let model = opt
        .get_model()
        .ok_or_else(|| PlannerError::Solver("no model".into()))?;
    let choice = read_choice(&model, &v)?;
    if !t.admits(&choice) {
        return Err(PlannerError::Solver(format!(
            "answer outside the tables: {choice:?}"
        )));
    }
    let cost = t.cost(&choice);
    if cost.decode_ns as i64 != get_int(&model, &decode)? {
        return Err(PlannerError::Solver(
            "the model's cost disagrees with the tables".into(),
        ));
    }
    Ok((choice, cost))
}
