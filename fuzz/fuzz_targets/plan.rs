#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // The same bytes as a device profile and as a plan; whatever loads is used and written back.
    let d = sparrow_fuzz::file("d.sparrow-device", data);
    if let Ok(dev) = engine::planner::DeviceProfile::load(&d) {
        for t in dev.thread_counts() {
            let _ = dev.kernel_rate("q4_0", t);
        }
        for q in dev.queue_depths() {
            let _ = dev.io_rate(4096, q);
        }
        let _ = dev.save(sparrow_fuzz::scratch().join("back"));
    }
    let p = sparrow_fuzz::file("p.sparrow-plan", data);
    if let Ok(plan) = engine::planner::Plan::load(&p) {
        let _ = plan.describe();
        let _ = plan.check_for(&p, 99, 2, Some(7));
        let _ = engine::PlanSettings::of(&plan);
        let _ = plan.save(sparrow_fuzz::scratch().join("back"));
    }
});
