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

/// Solves the tables exactly with Z3: the fastest configuration within `budget`, ties broken by
/// less memory, then by the deeper queue (the same order as `search` and `brute_force`).
pub fn solve_z3(t: &Tables, budget: u64) -> Result<(Choice, Cost)> {
    let opt = Optimize::new();
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

    let zero = Int::from_i64(0);
    let stream: Vec<Int> = res
        .iter()
        .zip(&t.tensors)
        .map(|(r, x)| r.ite(&zero, &int(x.1)))
        .collect();
    let attn = Int::add(&[vec![lookup(&ti, &t.attn_ns)], stream].concat());
    // Layer `l`'s column of a per-thread, per-layer table.
    let column = |table: &[Vec<u64>], l: usize| table.iter().map(|v| v[l]).collect::<Vec<u64>>();
    let sum = |terms: Vec<Int>| {
        if terms.is_empty() {
            Int::from_i64(0)
        } else {
            Int::add(&terms)
        }
    };
    let pred = sum(sparse
        .iter()
        .enumerate()
        .map(|(l, s)| s.ite(&lookup(&ti, &column(&t.pred_ns, l)), &zero))
        .collect());
    let ffn = sum(sparse
        .iter()
        .enumerate()
        .map(|(l, s)| {
            s.ite(
                &lookup(&ti, &column(&t.ffn_sparse_ns, l)),
                &lookup(&ti, &column(&t.ffn_dense_ns, l)),
            )
        })
        .collect());
    let io_terms: Vec<Int> = steps
        .iter()
        .enumerate()
        .map(|(l, s)| {
            let per_q: Vec<Int> = (0..t.queue_depths.len())
                .map(|q| lookup(s, &t.io_ns[q][l]))
                .collect();
            let mut e = per_q.last().expect("a queue depth").clone();
            for (q, v) in per_q.iter().enumerate().rev().skip(1) {
                e = qi.eq(Int::from_i64(q as i64)).ite(v, &e);
            }
            e
        })
        .collect();
    let io = sum(io_terms);
    let decode = Int::add(&[attn, pred, ffn.ge(&io).ite(&ffn, &io)]);
    let mut mem_terms = vec![int(t.fixed_bytes)];
    mem_terms.extend(
        sparse
            .iter()
            .zip(&t.pred_bytes)
            .map(|(s, &b)| s.ite(&int(b), &zero)),
    );
    mem_terms.extend(
        res.iter()
            .zip(&t.tensors)
            .map(|(r, x)| r.ite(&int(x.0), &zero)),
    );
    mem_terms.extend(
        steps
            .iter()
            .enumerate()
            .map(|(l, s)| lookup(s, &t.cache_bytes[l])),
    );
    let memory = Int::add(&mem_terms);
    opt.assert(memory.le(int(budget)));
    opt.minimize(&decode);
    opt.minimize(&memory);
    opt.maximize(&qi);
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
    let get_int = |x: &Int| -> Result<i64> {
        model
            .eval(x, true)
            .and_then(|v| v.as_i64())
            .ok_or_else(|| PlannerError::Solver("a variable has no value".into()))
    };
    let get_bool = |x: &Bool| -> Result<bool> {
        model
            .eval(x, true)
            .and_then(|v| v.as_bool())
            .ok_or_else(|| PlannerError::Solver("a variable has no value".into()))
    };
    let choice = Choice {
        threads: get_int(&ti)? as usize,
        queue_depth: get_int(&qi)? as usize,
        sparse: sparse.iter().map(get_bool).collect::<Result<_>>()?,
        steps: steps
            .iter()
            .map(|s| get_int(s).map(|v| v as u32))
            .collect::<Result<_>>()?,
        resident: res.iter().map(get_bool).collect::<Result<_>>()?,
    };
    if !t.admits(&choice) {
        return Err(PlannerError::Solver(format!(
            "answer outside the tables: {choice:?}"
        )));
    }
    let cost = t.cost(&choice);
    if cost.decode_ns as i64 != get_int(&decode)? {
        return Err(PlannerError::Solver(
            "the model's cost disagrees with the tables".into(),
        ));
    }
    Ok((choice, cost))
}
