//! A bundle's manifest: the size and FNV-1a 64 hash of every part `sparrow convert` wrote (resident
//! file, neuron store, profile, predictors), the source model's fingerprint, a version and the
//! manifest's own checksum. It lies next to the resident file, under the name the resident file
//! records ([`crate::bundle_parts::BundleParts`]; `<resident>.sparrow-manifest` in an older layout), and
//! is complete before the resident file that names it is renamed into place.
//!
//! Loading a resident file checks the sizes ([`Manifest::check_sizes`], cheap: one `stat` per part)
//! and that every part the manifest names is the bundle's own ([`Manifest::check_owner`]: the
//! resident file being loaded, the store and sidecars it names); `sparrow verify` checks every hash
//! too ([`Manifest::verify`]). An older bundle without a manifest (converted before manifests
//! existed) loads with a warning ([`ManifestStatus::Missing`]); a resident file that names a
//! manifest that is not there is an error.
//!
//! The text format, one field per line, parsed strictly (the file is untrusted input):
//!
//! ```text
//! sparrow-manifest 1
//! source-fingerprint 0123456789abcdef
//! part resident m.resident.gguf 48234496 fnv1a64:0123456789abcdef
//! part store m.resident.neurons 106954752 fnv1a64:0123456789abcdef
//! part profile m.resident.gguf.sparrow-profile 41216 fnv1a64:0123456789abcdef
//! checksum fnv1a64:0123456789abcdef
//! ```
//!
//! The checksum is the hash of every byte before its line. Part names are plain file names in the
//! resident file's folder ([`transformer::config::file_next_to`]); each role appears at most once and the
//! resident file and store always.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{BundleError, Result};

pub use crate::bundle_parts::MANIFEST_SUFFIX;
/// The manifest format version this build writes and reads.
pub const MANIFEST_VERSION: u32 = 1;
/// A manifest larger than this is refused before it is read (a real one is a few hundred bytes).
pub const MAX_MANIFEST_BYTES: u64 = 64 << 10;
const MAGIC: &str = "sparrow-manifest";
const HASH_PREFIX: &str = "fnv1a64:";
const CHUNK: usize = 1 << 20;

/// What a part of a bundle is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PartRole {
    /// The resident GGUF file.
    Resident,
    /// Its neuron store.
    Store,
    /// The activation profile copied next to it.
    Profile,
    /// The predictors copied next to it.
    Predictor,
}

impl PartRole {
    /// All roles, in manifest order.
    pub const ALL: [PartRole; 4] = [
        PartRole::Resident,
        PartRole::Store,
        PartRole::Profile,
        PartRole::Predictor,
    ];

    /// The role's name in the manifest and in messages.
    pub fn name(self) -> &'static str {
        match self {
            PartRole::Resident => "resident",
            PartRole::Store => "store",
            PartRole::Profile => "profile",
            PartRole::Predictor => "predictor",
        }
    }

    fn from_name(s: &str) -> Option<Self> {
        PartRole::ALL.into_iter().find(|r| r.name() == s)
    }
}

/// One part of a bundle as the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// What it is.
    pub role: PartRole,
    /// Its plain file name in the resident file's folder.
    pub file: String,
    /// Its size in bytes.
    pub size: u64,
    /// FNV-1a 64 of its bytes.
    pub hash: u64,
}

/// A bundle's manifest (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Fingerprint of the model the bundle was converted from.
    pub source_fingerprint: u64,
    /// The parts, in role order.
    pub parts: Vec<Part>,
}

/// What loading found about a resident file's manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestStatus {
    /// No manifest (a bundle converted before manifests existed): loaded unchecked.
    Missing(PathBuf),
    /// Every part listed has the size the manifest says.
    SizesMatch(PathBuf),
}

/// One line of `sparrow verify`: a part and what was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartCheck {
    /// The part as the manifest records it.
    pub part: Part,
    /// Where it is.
    pub path: PathBuf,
    /// `None` when size and hash match, else what is wrong.
    pub problem: Option<String>,
}

pub use crate::bundle_parts::manifest_path;

fn bad(path: &Path, detail: String) -> BundleError {
    BundleError::Bundle {
        path: path.to_path_buf(),
        detail,
    }
}

fn io(path: &Path, source: std::io::Error) -> BundleError {
    BundleError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// FNV-1a 64 of the file at `path`, read in 1 MiB chunks; `progress(bytes)` after each chunk.
pub fn hash_file(path: &Path, mut progress: impl FnMut(u64)) -> Result<(u64, u64)> {
    // A FIFO or device would block or never end: only regular files are read.
    let meta = std::fs::metadata(path).map_err(|e| io(path, e))?;
    if !meta.is_file() {
        return Err(bad(path, "not a regular file".into()));
    }
    let mut f = std::fs::File::open(path).map_err(|e| io(path, e))?;
    let mut h = predictor::Fnv1a64::default();
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(path, e)),
        };
        h.update(&buf[..n]);
        total += n as u64;
        progress(n as u64);
    }
    Ok((h.finish(), total))
}

impl Manifest {
    /// The manifest of the files `parts` (each in `resident`'s folder), hashing each.
    pub fn of_files(
        resident: &Path,
        source_fingerprint: u64,
        parts: &[(PartRole, PathBuf)],
    ) -> Result<Manifest> {
        for (_, path) in parts {
            let file = plain_name(path)?;
            let in_folder =
                transformer::config::file_next_to(resident, &file, "manifest part", "part")?;
            if !atomic_out::same_file(&in_folder, path) {
                return Err(bad(
                    path,
                    format!(
                        "not in the folder of the resident file {}",
                        resident.display()
                    ),
                ));
            }
        }
        Manifest::of_files_named(resident, source_fingerprint, parts)
    }

    /// As [`Manifest::of_files`], except that the resident part is recorded under `resident`'s name
    /// whatever file its bytes are read from (a convert hashes the resident file under its temporary
    /// name, before the rename that switches the bundle). The other parts must be plain names in
    /// `resident`'s folder.
    pub fn of_files_named(
        resident: &Path,
        source_fingerprint: u64,
        parts: &[(PartRole, PathBuf)],
    ) -> Result<Manifest> {
        let mut out = Vec::with_capacity(parts.len());
        for (role, path) in parts {
            let file = if *role == PartRole::Resident {
                plain_name(resident)?
            } else {
                plain_name(path)?
            };
            let (hash, size) = hash_file(path, |_| {})?;
            out.push(Part {
                role: *role,
                file,
                size,
                hash,
            });
        }
        out.sort_by_key(|p| p.role);
        let m = Manifest {
            source_fingerprint,
            parts: out,
        };
        m.check_roles(&manifest_path(resident))?;
        Ok(m)
    }

    /// The manifest's text (see the module docs), checksum included.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "{MAGIC} {MANIFEST_VERSION}\nsource-fingerprint {:016x}\n",
            self.source_fingerprint
        );
        for p in &self.parts {
            s.push_str(&format!(
                "part {} {} {} {HASH_PREFIX}{:016x}\n",
                p.role.name(),
                p.file,
                p.size,
                p.hash
            ));
        }
        let sum = fnv(s.as_bytes());
        s.push_str(&format!("checksum {HASH_PREFIX}{sum:016x}\n"));
        s
    }

    /// Parses a manifest's bytes; `path` names it in errors.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Manifest> {
        let text = std::str::from_utf8(bytes)
            .map_err(|e| bad(path, format!("the manifest is not UTF-8 text: {e}")))?;
        let body_end = text
            .rfind("checksum ")
            .filter(|&i| i == 0 || text.as_bytes()[i - 1] == b'\n')
            .ok_or_else(|| bad(path, "the manifest has no checksum line".into()))?;
        let sum_line = text[body_end..]
            .strip_suffix('\n')
            .ok_or_else(|| bad(path, "the manifest's checksum line is cut short".into()))?;
        let want = sum_line
            .strip_prefix("checksum ")
            .and_then(parse_hash)
            .ok_or_else(|| {
                bad(
                    path,
                    format!("bad checksum line `{}`", sum_line.escape_debug()),
                )
            })?;
        let body = &text[..body_end];
        let got = fnv(body.as_bytes());
        if got != want {
            return Err(bad(
                path,
                format!("the manifest is damaged: its checksum is {want:016x}, its contents hash to {got:016x}"),
            ));
        }
        let mut lines = body.lines();
        let header = lines.next().unwrap_or("");
        match header.split_once(' ') {
            Some((MAGIC, v)) if v == MANIFEST_VERSION.to_string() => {}
            Some((MAGIC, v)) => {
                return Err(bad(
                    path,
                    format!(
                    "manifest version `{}` is not supported (this build reads {MANIFEST_VERSION})",
                    v.escape_debug()
                ),
                ))
            }
            _ => return Err(bad(path, "not a Sparrow manifest".into())),
        }
        let fp_line = lines.next().unwrap_or("");
        let source_fingerprint = fp_line
            .strip_prefix("source-fingerprint ")
            .filter(|h| h.len() == 16)
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .ok_or_else(|| {
                bad(
                    path,
                    format!("bad source-fingerprint line `{}`", fp_line.escape_debug()),
                )
            })?;
        let mut parts = Vec::new();
        for line in lines {
            let f: Vec<&str> = line.split(' ').collect();
            let part = match f.as_slice() {
                ["part", role, file, size, hash] => PartRole::from_name(role).and_then(|role| {
                    Some(Part {
                        role,
                        file: file.to_string(),
                        size: size.parse().ok().filter(|_| !size.starts_with('+'))?,
                        hash: parse_hash(hash)?,
                    })
                }),
                _ => None,
            };
            let part =
                part.ok_or_else(|| bad(path, format!("bad part line `{}`", line.escape_debug())))?;
            if parts.len() == PartRole::ALL.len() {
                return Err(bad(path, "the manifest lists too many parts".into()));
            }
            parts.push(part);
        }
        let m = Manifest {
            source_fingerprint,
            parts,
        };
        m.check_roles(path)?;
        Ok(m)
    }

    /// Each role at most once, in order, the resident file and store present, plain names.
    fn check_roles(&self, path: &Path) -> Result<()> {
        for w in self.parts.windows(2) {
            if w[0].role >= w[1].role {
                return Err(bad(
                    path,
                    format!("part {} is listed twice or out of order", w[1].role.name()),
                ));
            }
        }
        for need in [PartRole::Resident, PartRole::Store] {
            if !self.parts.iter().any(|p| p.role == need) {
                return Err(bad(
                    path,
                    format!("the manifest lacks the {} part", need.name()),
                ));
            }
        }
        for (i, p) in self.parts.iter().enumerate() {
            if let Some(q) = self.parts[..i].iter().find(|q| q.file == p.file) {
                return Err(bad(
                    path,
                    format!(
                        "parts {} and {} are the same file `{}`",
                        q.role.name(),
                        p.role.name(),
                        p.file.escape_debug()
                    ),
                ));
            }
        }
        if let Some(p) = self.parts.iter().find(|p| {
            !transformer::config::FfnStoreRef::is_plain_name(&p.file)
                || p.file.contains(char::is_whitespace)
        }) {
            return Err(bad(
                path,
                format!(
                    "part {} `{}` is not a plain file name in the bundle's folder",
                    p.role.name(),
                    p.file.escape_debug()
                ),
            ));
        }
        Ok(())
    }

    /// Writes the manifest to `path` atomically.
    pub fn write_to(&self, path: &Path) -> Result<()> {
        Ok(atomic_out::write_atomic(path, self.to_text().as_bytes())?)
    }

    /// The manifest of the bundle of the resident file `resident` (at the path its layout gives,
    /// [`crate::bundle_parts::BundleParts`]), `None` when it has none.
    pub fn read(resident: &Path) -> Result<Option<Manifest>> {
        let path = match crate::bundle_parts::BundleParts::read(resident)? {
            Some(p) => p.manifest,
            None => manifest_path(resident),
        };
        Manifest::read_at(&path)
    }

    /// The manifest at `path`, `None` when there is no file there. Refused: anything but a regular
    /// file, and more than [`MAX_MANIFEST_BYTES`].
    pub fn read_at(path: &Path) -> Result<Option<Manifest>> {
        let path = path.to_path_buf();
        let meta = match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&path, e)),
            Ok(m) => m,
        };
        if !meta.is_file() {
            return Err(bad(&path, "the manifest is not a regular file".into()));
        }
        let bytes = atomic_out::read_bounded(&path, MAX_MANIFEST_BYTES)?;
        Manifest::parse(&path, &bytes).map(Some)
    }

    /// Checks that every part the manifest names is the bundle's own: the resident part is the
    /// resident file being loaded, the store and sidecars are the ones that file names, and the
    /// bundle's own profile and predictors are listed (a manifest naming another bundle's resident
    /// file once passed `sparrow verify` while `run` read the other one). `None` when they are,
    /// else what is wrong, for the role concerned.
    pub fn owner_problem(
        &self,
        parts: &crate::bundle_parts::BundleParts,
    ) -> Option<(PartRole, String)> {
        for p in &self.parts {
            let Some(want) = parts.of_role(p.role) else {
                return Some((
                    p.role,
                    format!(
                        "the manifest lists {} `{}`, but the resident file {} has no {} part",
                        p.role.name(),
                        p.file.escape_debug(),
                        parts.resident.display(),
                        p.role.name()
                    ),
                ));
            };
            let here = parts
                .resident
                .parent()
                .unwrap_or(Path::new(""))
                .join(&p.file);
            if here != want && !atomic_out::same_file(&here, want) {
                return Some((
                    p.role,
                    format!(
                        "the manifest names {} as the {} part, but this bundle's is {}: the manifest is not this bundle's",
                        here.display(),
                        p.role.name(),
                        want.display()
                    ),
                ));
            }
        }
        if parts.recorded {
            let listed = |r: PartRole| self.parts.iter().any(|p| p.role == r);
            for (role, has) in [
                (PartRole::Profile, true),
                (PartRole::Predictor, parts.predictor.is_some()),
            ] {
                if has && !listed(role) {
                    return Some((
                        role,
                        format!(
                            "the resident file {} names a {} part the manifest does not list",
                            parts.resident.display(),
                            role.name()
                        ),
                    ));
                }
            }
        }
        None
    }

    /// [`Manifest::owner_problem`] as an error naming the manifest.
    pub fn check_owner(&self, parts: &crate::bundle_parts::BundleParts) -> Result<()> {
        match self.owner_problem(parts) {
            None => Ok(()),
            Some((_, problem)) => Err(bad(
                &parts.manifest,
                format!("{problem} (re-run sparrow convert)"),
            )),
        }
    }

    /// Each part's path next to `resident`, checked as the store's name is (plain name, no link out).
    fn part_path(&self, resident: &Path, p: &Part) -> Result<PathBuf> {
        Ok(transformer::config::file_next_to(
            resident,
            &p.file,
            "manifest part",
            p.role.name(),
        )?)
    }

    /// Checks that every part exists with the size the manifest gives (cheap: no data is read). The
    /// error names the part.
    pub fn check_sizes(&self, resident: &Path, fingerprint: Option<u64>) -> Result<()> {
        let mpath = match crate::bundle_parts::BundleParts::read(resident)? {
            Some(p) => p.manifest,
            None => manifest_path(resident),
        };
        self.check_sizes_at(resident, &mpath, fingerprint)
    }

    fn check_sizes_at(
        &self,
        resident: &Path,
        mpath: &Path,
        fingerprint: Option<u64>,
    ) -> Result<()> {
        if let Some(fp) = fingerprint.filter(|&f| f != self.source_fingerprint) {
            return Err(bad(
                mpath,
                format!(
                    "the manifest is for a conversion of model {:016x}, the resident file comes from {fp:016x} (re-run sparrow convert)",
                    self.source_fingerprint
                ),
            ));
        }
        for p in &self.parts {
            let path = self.part_path(resident, p)?;
            if let Some(problem) = size_problem(&path, p) {
                return Err(bad(
                    &path,
                    format!(
                        "{problem}: the {} part does not match the bundle's manifest {} (re-run sparrow convert)",
                        p.role.name(),
                        mpath.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Total bytes of all parts (for progress).
    pub fn total_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.size).sum()
    }

    /// Reads every part and compares its size and hash; `progress(bytes)` as it reads. Returns one
    /// check per part (an unreadable part is a problem of its check, not an error).
    /// Each part is checked to be the bundle's own first ([`Manifest::owner_problem`]) when `resident`
    /// is a resident file.
    pub fn verify(&self, resident: &Path, mut progress: impl FnMut(u64)) -> Result<Vec<PartCheck>> {
        let owner = match crate::bundle_parts::BundleParts::read(resident)? {
            Some(parts) => self.owner_problem(&parts),
            None => None,
        };
        let mut out = Vec::with_capacity(self.parts.len());
        for p in &self.parts {
            let path = self.part_path(resident, p)?;
            let foreign = owner
                .as_ref()
                .filter(|(role, _)| *role == p.role)
                .map(|(_, s)| s.clone());
            let problem = match foreign.or_else(|| size_problem(&path, p)) {
                Some(s) => Some(s),
                None => match hash_file(&path, &mut progress) {
                    Err(e) => Some(e.to_string()),
                    Ok((_, n)) if n != p.size => {
                        Some(format!("{n} bytes read, the manifest says {}", p.size))
                    }
                    Ok((h, _)) if h != p.hash => Some(format!(
                        "contents differ: hash {h:016x}, the manifest says {:016x}",
                        p.hash
                    )),
                    Ok(_) => None,
                },
            };
            out.push(PartCheck {
                part: p.clone(),
                path,
                problem,
            });
        }
        Ok(out)
    }
}

/// What is wrong with the size of the part `p` at `path`, if anything.
fn size_problem(path: &Path, p: &Part) -> Option<String> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("missing".into()),
        Err(e) => Some(e.to_string()),
        Ok(m) if !m.is_file() => Some("not a regular file".into()),
        Ok(m) if m.len() != p.size => {
            Some(format!("{} bytes, the manifest says {}", m.len(), p.size))
        }
        Ok(_) => None,
    }
}

/// The file name of `path` if a manifest can record it (a plain name without blanks).
fn plain_name(path: &Path) -> Result<String> {
    path.file_name()
        .and_then(|n| n.to_str())
        .filter(|n| {
            transformer::config::FfnStoreRef::is_plain_name(n) && !n.contains(char::is_whitespace)
        })
        .map(str::to_string)
        .ok_or_else(|| bad(path, "not a file name a manifest can record".into()))
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h = predictor::Fnv1a64::default();
    h.update(bytes);
    h.finish()
}

fn parse_hash(s: &str) -> Option<u64> {
    let h = s.strip_prefix(HASH_PREFIX)?;
    (h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u64::from_str_radix(h, 16).ok())
        .flatten()
}

/// Checks the manifest of the bundle `parts` at load: that it is there when the resident file names
/// it, that every part it lists is the bundle's own, their sizes, and the source fingerprint against
/// the one the resident file carries.
pub fn check_at_load(
    parts: &crate::bundle_parts::BundleParts,
    fingerprint: u64,
) -> Result<ManifestStatus> {
    let path = parts.manifest.clone();
    match Manifest::read_at(&path)? {
        None if parts.recorded => Err(bad(
            &path,
            format!(
                "missing: the resident file {} names this manifest (the bundle is incomplete; re-run sparrow convert)",
                parts.resident.display()
            ),
        )),
        None => Ok(ManifestStatus::Missing(path)),
        Some(m) => {
            m.check_owner(parts)?;
            m.check_sizes_at(&parts.resident, &path, Some(fingerprint))?;
            Ok(ManifestStatus::SizesMatch(path))
        }
    }
}

impl crate::bundle_parts::BundleParts {
    /// The path the bundle gives the part of role `role` (`None`: a bundle without predictors).
    pub fn of_role(&self, role: PartRole) -> Option<&Path> {
        match role {
            PartRole::Resident => Some(&self.resident),
            PartRole::Store => Some(&self.store),
            PartRole::Profile => Some(&self.profile),
            PartRole::Predictor => self.predictor.as_deref(),
        }
    }
}

/// Writes the manifest of the bundle of the resident file `resident` (converted from a model with
/// fingerprint `source_fingerprint`) at the path its layout gives ([`crate::bundle_parts::BundleParts`]): the resident
/// file, its store, and its profile and predictors when they exist. `sparrow convert` seals the
/// bundles it writes itself; this re-seals one whose parts were replaced by hand (an older layout's
/// profile), and is what tests use.
pub fn seal_manifest(resident: &Path, source_fingerprint: u64) -> Result<Manifest> {
    let parts =
        crate::bundle_parts::BundleParts::read(resident)?.ok_or_else(|| BundleError::BadModel {
            path: resident.to_path_buf(),
            detail: "not a resident file (sparrow convert writes one)".into(),
        })?;
    let mut list = vec![
        (PartRole::Resident, resident.to_path_buf()),
        (PartRole::Store, parts.store.clone()),
    ];
    if parts.profile.exists() {
        list.push((PartRole::Profile, parts.profile.clone()));
    }
    if let Some(p) = &parts.predictor {
        list.push((PartRole::Predictor, p.clone()));
    }
    let m = Manifest::of_files(resident, source_fingerprint, &list)?;
    Ok(atomic_out::write_atomic(&parts.manifest, m.to_text().as_bytes()).map(|()| m)?)
}
