#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(set) = predictor::PredictorSet::load(sparrow_fuzz::file("p.pred", data)) {
        for p in &set.layers {
            let mut out = vec![0.0; p.n_out()];
            let _ = p.scores(&vec![0.5; p.d_in()], &mut out);
        }
    }
});
