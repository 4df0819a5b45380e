//! Backend selection by name: [`AccelKind`] says which backend (parsed without knowing any), a
//! [`Registry`] maps names to the [`Backend`]s a build has and opens them.

use std::path::PathBuf;

use crate::cpu::CpuAccelerator;
use crate::{AccelError, Accelerator, FfnBlock, Result};

/// Which backend to open: `NAME[-VARIANT][:PATH]` (`cpu`, `qnn`, `qnn:/x/libQnnHtp.so`,
/// `qnn-f32`). The name is what device profiles and plans call the backend; the variant and the
/// path mean what the backend says (QNN: the weights' form and its library).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AccelKind {
    name: String,
    variant: Option<String>,
    path: Option<PathBuf>,
}

impl AccelKind {
    /// Backend `name` (letters, digits, `_`), with a variant and a path if given.
    pub fn new(name: impl Into<String>, variant: Option<&str>, path: Option<PathBuf>) -> AccelKind {
        AccelKind {
            name: name.into(),
            variant: variant.map(str::to_string),
            path,
        }
    }

    /// The CPU stand-in.
    pub fn cpu() -> AccelKind {
        AccelKind::new("cpu", None, None)
    }

    /// Whether this is the CPU stand-in.
    pub fn is_cpu(&self) -> bool {
        self.name == "cpu"
    }

    /// The backend's name, as device profiles and plans name it (`cpu`, `qnn`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The variant after the name's `-`, if any.
    pub fn variant(&self) -> Option<&str> {
        self.variant.as_deref()
    }

    /// The path after the `:`, if any.
    pub fn path(&self) -> Option<&std::path::Path> {
        self.path.as_deref()
    }
}

impl std::fmt::Display for AccelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)?;
        if let Some(v) = &self.variant {
            write!(f, "-{v}")?;
        }
        if let Some(p) = &self.path {
            write!(f, ":{}", p.display())?;
        }
        Ok(())
    }
}

impl std::str::FromStr for AccelKind {
    type Err = String;

    /// `NAME[-VARIANT][:PATH]`; whether a backend of that name exists is the registry's question.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (head, path) = match s.split_once(':') {
            Some((h, p)) if !p.is_empty() => (h, Some(PathBuf::from(p))),
            Some(_) => return Err(format!("`{s}`: give the library after the colon")),
            None => (s, None),
        };
        let (name, variant) = match head.split_once('-') {
            Some((n, v)) => (n, Some(v)),
            None => (head, None),
        };
        let word =
            |w: &str| !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !word(name) || !variant.is_none_or(word) {
            return Err(format!(
                "`{s}`: expected a backend as NAME[-VARIANT][:LIBRARY] (cpu, qnn, qnn:LIBRARY, qnn-f32, qnn-f32:LIBRARY)"
            ));
        }
        Ok(AccelKind::new(name, variant, path))
    }
}

/// Opens a backend of the kind given over blocks (one per layer, taken one at a time so that only
/// one layer's f32 block exists at once).
pub type OpenFn = fn(
    kind: &AccelKind,
    blocks: &mut dyn Iterator<Item = Result<FfnBlock>>,
) -> Result<Box<dyn Accelerator>>;

/// A backend a registry can open.
#[derive(Debug, Clone, Copy)]
pub struct Backend {
    /// Its name ([`AccelKind::name`]).
    pub name: &'static str,
    /// The kinds it takes, for messages (`qnn, qnn:LIBRARY, qnn-f32, qnn-f32:LIBRARY`).
    pub usage: &'static str,
    /// Opens it.
    pub open: OpenFn,
}

/// The backends of a build, by name. [`Registry::new`] holds `cpu`; a front end registers the
/// others it was built with, and names the ones it was built without ([`Registry::left_out`]) so
/// that asking for one says so.
#[derive(Debug, Clone)]
pub struct Registry {
    backends: Vec<Backend>,
    left_out: Vec<(&'static str, &'static str)>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

fn open_cpu(
    kind: &AccelKind,
    blocks: &mut dyn Iterator<Item = Result<FfnBlock>>,
) -> Result<Box<dyn Accelerator>> {
    if kind.variant.is_some() || kind.path.is_some() {
        return Err(AccelError::Request(format!(
            "accelerator `{kind}`: the cpu backend takes no variant and no library"
        )));
    }
    Ok(Box::new(CpuAccelerator::new(blocks)?))
}

impl Registry {
    /// A registry holding the CPU stand-in.
    pub fn new() -> Registry {
        Registry {
            backends: vec![Backend {
                name: "cpu",
                usage: "cpu",
                open: open_cpu,
            }],
            left_out: Vec::new(),
        }
    }

    /// Adds `backend`, replacing one of the same name.
    pub fn register(&mut self, backend: Backend) {
        self.backends.retain(|b| b.name != backend.name);
        self.left_out.retain(|(n, _)| *n != backend.name);
        self.backends.push(backend);
    }

    /// Records that backend `name` is not in this build, and `why` (asking for it then fails with
    /// that reason).
    pub fn left_out(&mut self, name: &'static str, why: &'static str) {
        if self.get(name).is_none() {
            self.left_out.push((name, why));
        }
    }

    /// The backend called `name`.
    pub fn get(&self, name: &str) -> Option<&Backend> {
        self.backends.iter().find(|b| b.name == name)
    }

    /// The registered backends' names, in registration order.
    pub fn names(&self) -> Vec<&'static str> {
        self.backends.iter().map(|b| b.name).collect()
    }

    /// Opens `kind` over `blocks`; a name with no backend is an [`AccelError::Unknown`].
    pub fn open(
        &self,
        kind: &AccelKind,
        blocks: impl IntoIterator<Item = Result<FfnBlock>>,
    ) -> Result<Box<dyn Accelerator>> {
        let Some(backend) = self.get(kind.name()) else {
            let why = self
                .left_out
                .iter()
                .find(|(n, _)| *n == kind.name())
                .map_or("no such backend", |(_, why)| why);
            return Err(AccelError::Unknown {
                name: kind.to_string(),
                why: why.to_string(),
                known: self
                    .backends
                    .iter()
                    .map(|b| b.usage)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        (backend.open)(kind, &mut blocks.into_iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse() {
        assert_eq!("cpu".parse::<AccelKind>(), Ok(AccelKind::cpu()));
        let q: AccelKind = "qnn-f32:/x/libQnnHtp.so".parse().unwrap();
        assert_eq!(
            (q.name(), q.variant(), q.path()),
            (
                "qnn",
                Some("f32"),
                Some(std::path::Path::new("/x/libQnnHtp.so"))
            )
        );
        assert_eq!(q.to_string(), "qnn-f32:/x/libQnnHtp.so");
        assert!("gpu".parse::<AccelKind>().is_ok());
        for bad in ["qnn:", "", "-f32", "qnn-", "a b", "qnn-f/32"] {
            assert!(bad.parse::<AccelKind>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_registry_opens_what_it_has_and_says_why_not() {
        let mut r = Registry::new();
        assert!(r.open(&AccelKind::cpu(), std::iter::empty()).is_ok());
        let e = r
            .open(&"cpu:/x".parse().unwrap(), std::iter::empty())
            .err()
            .unwrap();
        assert!(e.to_string().contains("takes no variant"), "{e}");
        r.left_out("qnn", "this build has no QNN backend");
        let e = r
            .open(&"qnn".parse().unwrap(), std::iter::empty())
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            "accelerator `qnn`: this build has no QNN backend (backends in this build: cpu)"
        );
        let e = r
            .open(&"gpu".parse().unwrap(), std::iter::empty())
            .err()
            .unwrap();
        assert!(e.to_string().contains("no such backend"), "{e}");
        r.register(Backend {
            name: "gpu",
            usage: "gpu",
            open: open_cpu,
        });
        assert_eq!(r.names(), ["cpu", "gpu"]);
        let a = r.open(&"gpu".parse().unwrap(), std::iter::empty()).unwrap();
        assert_eq!(a.name(), "cpu");
    }
}
