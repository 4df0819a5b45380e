#![no_main]
use std::sync::Mutex;

use ufs_io::{IoConfig, IoEngine, OpenOptions};

/// One engine, replaced every 256 inputs: it keeps every file it opened.
static IO: Mutex<Option<(IoEngine, u32)>> = Mutex::new(None);

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let path = sparrow_fuzz::file("m.neurons", data);
    let mut io = IO.lock().unwrap();
    if io.as_ref().is_none_or(|(_, n)| *n >= 256) {
        // Dropping an engine joins its I/O thread (seconds): not on the fuzzing thread.
        if let Some((old, _)) = io.replace((IoEngine::new(IoConfig::default()).unwrap(), 0)) {
            std::thread::spawn(move || drop(old));
        }
    }
    let (engine, n) = io.as_mut().unwrap();
    *n += 1;
    if let Ok(store) = neuron_store::NeuronStore::open(engine, &path, OpenOptions::default()) {
        let _ = store.verify_all(engine);
    }
});
