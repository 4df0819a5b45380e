//! One kernel path's `matvec` of one format, `CALLS` times on one thread: the program whose guest
//! instructions the NEON proxy counts per call (`qemu-aarch64 -cpu max -plugin
//! target/qemu-plugin/libinsn_count.so,out=FILE`; the difference of two call counts over the
//! difference of calls cancels the set-up). The matrix is the benches' random bytes (every format
//! has them), the activations fixed.
//!
//! `cargo build --profile ci --target aarch64-unknown-linux-gnu -p kernels-neon --example
//! matvec_count`, then `matvec_count FORMAT PATH ROWSxCOLS CALLS [fast|int8] [rows]` (`PATH`: a
//! `KernelPath` name, `neon`, `neon+dotprod`, `neon+i8mm`, `scalar`, ...). With `rows`, each call
//! is the sparse FFN's: activations prepared once (`prepare_acts`, on the active path), then one
//! `matvec_rows_prepared` per row (a neuron store's one-row units).

use kernels_neon::*;

#[allow(dead_code)]
#[path = "../benches/common/mod.rs"]
mod common;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "matvec_count FORMAT PATH ROWSxCOLS CALLS [fast|int8]";
    assert!(args.len() >= 4, "{usage}");
    let name = &args[0];
    let format = WeightFormat::GGML
        .into_iter()
        .find(|f| f.name().eq_ignore_ascii_case(name))
        .unwrap_or_else(|| panic!("unknown format `{name}` ({usage})"));
    let path = available_paths()
        .into_iter()
        .find(|p| p.name() == args[1])
        .unwrap_or_else(|| panic!("path `{}` is not available here", args[1]));
    let (rows, cols) = args[2].split_once('x').expect(usage);
    let (rows, cols): (usize, usize) = (rows.parse().expect(usage), cols.parse().expect(usage));
    let calls: usize = args[3].parse().expect(usage);
    let precision = match args.get(4).map(String::as_str) {
        Some("int8") => Precision::Int8,
        _ => Precision::Fast,
    };
    let data = common::random_matrix(format, rows, cols, 0);
    let w = QMatrix::new(format, rows, cols, &data).unwrap();
    let x: Vec<f32> = (0..cols)
        .map(|i| ((i * 31) % 61) as f32 / 61.0 - 0.5)
        .collect();
    let mut y = vec![0f32; rows];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let mut sum = 0f64;
    let per_row = args.get(5).is_some_and(|a| a == "rows");
    pool.install(|| {
        for _ in 0..calls {
            if per_row {
                let acts = prepare_acts(format, &x, precision);
                for (r, yr) in y.chunks_mut(1).enumerate() {
                    matvec_rows_prepared(&acts, &w, &[r as u32], yr).unwrap();
                }
            } else {
                matvec_with(path, &w, &x, &mut y, precision).unwrap();
            }
            sum += f64::from(y[rows / 2]);
        }
    });
    println!(
        "{format:?} {} {rows}x{cols} {precision:?} x{calls}: {sum}",
        path.name()
    );
}
