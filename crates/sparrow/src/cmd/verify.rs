//! `sparrow verify`: check every part of a converted bundle against its manifest (sizes and hashes).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use engine::bundle::BundleParts;
use engine::manifest::Manifest;

use crate::ui::{bar, mib};

#[derive(Args)]
pub struct VerifyArgs {
    /// The resident file of the bundle (`sparrow convert`'s output), which names its manifest
    /// (`<resident>.sparrow-manifest` in bundles of older converts).
    pub bundle: PathBuf,
}

/// Reads every part, prints one line per part, fails if any does not match.
pub fn run(a: VerifyArgs) -> Result<()> {
    let Some(parts) = BundleParts::read(&a.bundle)? else {
        bail!(
            "{}: not a resident file (`sparrow verify` checks the bundle `sparrow convert` writes)",
            a.bundle.display()
        );
    };
    let Some(m) = Manifest::read_at(&parts.manifest)? else {
        if parts.recorded {
            bail!(
                "{}: missing: the resident file {} names this manifest (the bundle is incomplete; re-run sparrow convert)",
                parts.manifest.display(),
                a.bundle.display()
            );
        }
        bail!(
            "{}: no manifest (a bundle converted before manifests existed; run `sparrow convert` again to write one)",
            parts.manifest.display()
        );
    };
    let b = bar(m.total_bytes(), "bytes");
    let checks = m.verify(&a.bundle, |n| b.inc(n))?;
    b.finish_and_clear();
    let mut bad = 0;
    for c in &checks {
        match &c.problem {
            None => println!(
                "ok      {:<9} {} ({:.1} MiB, fnv1a64 {:016x})",
                c.part.role.name(),
                c.path.display(),
                mib(c.part.size),
                c.part.hash
            ),
            Some(p) => {
                bad += 1;
                println!(
                    "BAD     {:<9} {}: {p}",
                    c.part.role.name(),
                    c.path.display()
                );
            }
        }
    }
    if bad > 0 {
        bail!(
            "{}: {bad} of {} parts do not match the manifest (re-run sparrow convert)",
            a.bundle.display(),
            checks.len()
        );
    }
    println!(
        "bundle {}: {} parts match the manifest (source model {:016x})",
        a.bundle.display(),
        checks.len(),
        m.source_fingerprint
    );
    Ok(())
}
