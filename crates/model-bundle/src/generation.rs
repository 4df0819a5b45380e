//! A convert's generation: the new names its parts are written under beside an existing bundle
//! (`m.resident.g<pid>-<time>.neurons`, `m.resident.gguf.g<pid>-<time>.sparrow-profile`, ...), the
//! steps at which it can fail ([`ConvertStep`]), and removing the parts it replaced once the
//! resident file is switched to it.

use std::path::{Path, PathBuf};

use crate::bundle_parts::{BundleParts, PREDICTOR_SUFFIX, PROFILE_SUFFIX};
use crate::error::{BundleError, Result};
use crate::manifest::MANIFEST_SUFFIX;

/// The points of a convert, in order, after which a test can make it fail
/// ([`super::ConvertOptions::fault`]) as a full disk or a kill would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvertStep {
    /// The new store is written (under its new name).
    Store,
    /// The profile is copied into the bundle (under its new name).
    Profile,
    /// The predictors are copied (under their new name; only when the bundle has them).
    Predictor,
    /// The resident file is complete under its temporary name, not yet renamed.
    Resident,
    /// The manifest is written (under its new name): the last step before the switch.
    Manifest,
    /// The resident file is renamed into place: the bundle is the new one.
    Switched,
}

impl ConvertStep {
    /// Every step, in order.
    pub const ALL: [ConvertStep; 6] = [
        ConvertStep::Store,
        ConvertStep::Profile,
        ConvertStep::Predictor,
        ConvertStep::Resident,
        ConvertStep::Manifest,
        ConvertStep::Switched,
    ];
}

/// The names of one convert's parts next to the resident file `resident`.
#[derive(Debug, Clone)]
pub(crate) struct Generation {
    pub(crate) store: PathBuf,
    pub(crate) profile: PathBuf,
    pub(crate) predictor: PathBuf,
    pub(crate) manifest: PathBuf,
}

impl Generation {
    /// New names for a convert to `resident`: a tag of this process's id and the time, retried until
    /// no file has any of the names.
    pub(crate) fn new(resident: &Path) -> Result<Self> {
        let name = resident
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| {
                BundleError::Request(format!("{}: not a file name", resident.display()))
            })?;
        let stem = resident
            .file_stem()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| name.clone());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        for k in 0..1000u64 {
            let tag = format!("g{}-{:x}", std::process::id(), nanos.wrapping_add(k));
            let g = Generation {
                store: resident.with_file_name(format!("{stem}.{tag}.neurons")),
                profile: resident.with_file_name(format!("{name}.{tag}{PROFILE_SUFFIX}")),
                predictor: resident.with_file_name(format!("{name}.{tag}{PREDICTOR_SUFFIX}")),
                manifest: resident.with_file_name(format!("{name}.{tag}{MANIFEST_SUFFIX}")),
            };
            let taken = [&g.store, &g.profile, &g.predictor, &g.manifest]
                .iter()
                .any(|p| std::fs::symlink_metadata(p).is_ok());
            if !taken {
                return Ok(g);
            }
        }
        Err(BundleError::Request(format!(
            "{}: no free name for the new parts of the bundle",
            resident.display()
        )))
    }

    /// Removes the new parts written so far (a convert that failed before its switch).
    pub(crate) fn remove(&self) {
        for p in [&self.store, &self.profile, &self.predictor, &self.manifest] {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The file name of `p` as a string, for the resident file's metadata.
pub(crate) fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Whether `name` is a name a convert to the resident file `resident` gives a part: this build's
/// (`<stem>.g<pid>-<hex>.neurons`, `<name>.g<pid>-<hex>.sparrow-{profile,predictor,manifest}`) or an
/// older layout's (`<stem>.neurons`, `<name>.sparrow-{profile,predictor,manifest}`). Only such files are
/// ever removed: a hostile resident file naming another file of the folder as its store cannot make a
/// convert over it delete that file.
fn is_part_name(resident: &Path, name: &str) -> bool {
    let (Some(file), Some(stem)) = (
        resident.file_name().and_then(|n| n.to_str()),
        resident.file_stem().and_then(|n| n.to_str()),
    ) else {
        return false;
    };
    let generation = |tag: &str| {
        tag.is_empty()
            || tag
                .strip_prefix(".g")
                .and_then(|t| t.split_once('-'))
                .is_some_and(|(pid, time)| {
                    !pid.is_empty()
                        && !time.is_empty()
                        && pid.bytes().all(|b| b.is_ascii_digit())
                        && time.bytes().all(|b| b.is_ascii_hexdigit())
                })
    };
    let store = name
        .strip_prefix(stem)
        .and_then(|r| r.strip_suffix(".neurons"))
        .is_some_and(generation);
    let sidecar = [PROFILE_SUFFIX, PREDICTOR_SUFFIX, MANIFEST_SUFFIX]
        .iter()
        .any(|suffix| {
            name.strip_prefix(file)
                .and_then(|r| r.strip_suffix(suffix))
                .is_some_and(generation)
        });
    store || sidecar
}

/// After the switch: removes the parts of the bundle `old` replaced (its resident file excepted,
/// which the switch replaced), unless one is also a part of `new` or one of `keep` (the convert's
/// inputs), or is not named as a convert names parts ([`is_part_name`]). Returns the paths removed;
/// a part that cannot be removed is left (it is no longer part of any bundle).
pub(crate) fn remove_replaced(
    old: &BundleParts,
    new: &BundleParts,
    keep: &[PathBuf],
) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let newer = new.all();
    for p in old.all().into_iter().skip(1) {
        let ours = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| is_part_name(&old.resident, n));
        let shared = newer
            .iter()
            .chain(keep)
            .any(|k| k == &p || atomic_out::same_file(k, &p));
        if ours
            && !shared
            && std::fs::symlink_metadata(&p).is_ok()
            && std::fs::remove_file(&p).is_ok()
        {
            removed.push(p);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_a_convert_gives_parts_are_parts() {
        let r = Path::new("dir/m.resident.gguf");
        for ok in [
            "m.resident.neurons",
            "m.resident.g12-18ed49dbb24fa439.neurons",
            "m.resident.gguf.sparrow-profile",
            "m.resident.gguf.g12-ab.sparrow-predictor",
            "m.resident.gguf.g1-0.sparrow-manifest",
        ] {
            assert!(is_part_name(r, ok), "{ok}");
        }
        for not in [
            "m.gguf",
            "notes.txt",
            "m.resident.gguf",
            "m.resident.x.neurons",
            "m.resident.g-1.neurons",
            "m.resident.g1-.neurons",
            "m.resident.gguf.g1-zz.sparrow-profile",
            "other.neurons",
            "m.resident.gguf.sparrow-plan",
        ] {
            assert!(!is_part_name(r, not), "{not}");
        }
        let g = Generation::new(r).unwrap();
        for p in [&g.store, &g.profile, &g.predictor, &g.manifest] {
            assert!(is_part_name(r, &name_of(p)), "{}", p.display());
        }
    }
}
