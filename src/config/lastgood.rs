//! A broken file never takes the others down.
//!
//! Each file of the config that loads is kept as its last good copy in
//! `state_dir/last-good/` (named by its absolute path, `%` and `/` escaped), written
//! durably (temporary file, fsync, rename, fsync of the directory) whenever it loads:
//! at start, and by each reload that succeeds.
//!
//! At start, a config with errors is made of the files that load as they are, the last
//! good copy of each one that does not, and nothing of a file without a copy. What the
//! composition still finds wrong (a service in `after` that only a broken file defined)
//! sets the file it is found in one step back (as it is, its copy, nothing) and the
//! composition is tried again; then each file set back is tried one step forward, in
//! file order, and kept there if the whole still loads. The main file with nothing of
//! it stands for its `[supd]` table alone, each valid key kept and each bad one at its
//! default, with its `include`s: the included files that load still run.

use super::error::ConfigError;
use super::load::load_from;
use super::{read, Config, SupdConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The directory of the copies, in `state_dir`.
pub const DIR: &str = "last-good";

/// What stands for a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Using {
    AsIs,
    Copy,
    Nothing,
}

/// A file that does not load, as `status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokenFile {
    pub file: PathBuf,
    /// Its first error (`file:line:column: key: message`), and how many more it has.
    pub error: String,
    /// "last good copy" or "nothing".
    pub using: String,
}

impl BrokenFile {
    /// Whether its last good copy stands for it.
    pub fn has_copy(&self) -> bool {
        self.using == "last good copy"
    }
}

/// The config supd starts with.
pub struct Loaded {
    pub cfg: Config,
    /// Every error of the files that do not load, in file order.
    pub errors: Vec<ConfigError>,
    pub broken: Vec<BrokenFile>,
    /// The files used as they are, with their text: their copies to refresh ([`keep`]).
    pub good: Vec<(PathBuf, String)>,
    /// The broken files with nothing standing for them though a copy is kept (it is
    /// corrupt, or clashes with the files as they are now), with the copy's first error.
    pub unusable_copies: Vec<(PathBuf, String)>,
}

/// The config at start: the whole of it when it loads, else composed as the module
/// says.
pub fn load_at_start(path: &Path) -> Loaded {
    let main = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    // Where the copies are: the state_dir the main file names, as far as it can be read.
    let state_dir = super::load_supd_only(&main).unwrap_or_default().state_dir;
    let mut c = Compose {
        main,
        copies: state_dir.join(DIR),
        texts: BTreeMap::new(),
        using: BTreeMap::new(),
        errors: BTreeMap::new(),
        copy_errors: BTreeMap::new(),
        order: Vec::new(),
    };
    let mut result = c.attempt();
    // Each round sets at least one file back one step, and a file has three.
    let mut rounds = 0;
    let cfg = loop {
        let errs = match result {
            Ok(cfg) => break cfg,
            Err(errs) => errs,
        };
        rounds += 1;
        let mut by_file: BTreeMap<PathBuf, Vec<ConfigError>> = BTreeMap::new();
        for e in errs {
            by_file.entry(e.file.clone()).or_default().push(e);
        }
        let mut moved = false;
        for (file, errs) in by_file {
            let file = c.culprit(&file);
            moved |= c.step_back(&file, errs);
        }
        if !moved || rounds > 3 * (c.order.len() + 2) {
            break c.nothing_at_all();
        }
        result = c.attempt();
    };
    let cfg = c.forward(cfg);
    c.finish(cfg)
}

/// Reads the config as [`super::load`] does; when it loads, refreshes the copies of its
/// files (in the state_dir it names) and forgets those of files it no longer has: a
/// reload's helper.
pub fn load_and_keep(path: &Path) -> Result<Config, Vec<ConfigError>> {
    let mut texts = Vec::new();
    let cfg = load_from(
        path,
        &mut |p| {
            let t = read::read_config_file(p);
            if let Ok(t) = &t {
                texts.push((p.to_path_buf(), t.clone()));
            }
            t
        },
        false,
    )?;
    keep(&cfg.supd.state_dir, &texts, true);
    Ok(cfg)
}

/// Writes the copies of `good` files that differ from what is kept, durably; with
/// `all` (every file loaded), forgets the copies of files the config no longer has.
pub fn keep(state_dir: &Path, good: &[(PathBuf, String)], all: bool) {
    let dir = state_dir.join(DIR);
    if let Err(e) = crate::records::create_dirs(&dir, crate::records::PRIVATE_DIR) {
        log::warn!(
            "cannot keep the config's last good copies in {}: {e}",
            dir.display()
        );
        return;
    }
    let mut names = Vec::new();
    for (file, text) in good {
        let Some(name) = copy_name(file) else {
            log::warn!(
                "{}: its path is too long to name its last good copy",
                file.display()
            );
            continue;
        };
        let to = dir.join(&name);
        names.push(name);
        if std::fs::read(&to).is_ok_and(|kept| kept == text.as_bytes()) {
            continue;
        }
        if let Err(e) = crate::records::atomic_write(&to, text.as_bytes(), true) {
            log::warn!(
                "{}: cannot keep its last good copy {}: {e}",
                file.display(),
                to.display()
            );
        }
    }
    if !all {
        return;
    }
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && !names.contains(&name) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The name of a file's copy: its absolute path with `%` and `/` escaped (`None` past a
/// file name's 255 bytes).
fn copy_name(file: &Path) -> Option<String> {
    let name = file
        .to_string_lossy()
        .replace('%', "%25")
        .replace('/', "%2F");
    (name.len() <= 240).then_some(name)
}

/// The composition under way.
struct Compose {
    main: PathBuf,
    copies: PathBuf,
    /// Each file's text as it is (read once).
    texts: BTreeMap<PathBuf, Result<String, String>>,
    /// What stands for each file set back (the others: as they are).
    using: BTreeMap<PathBuf, Using>,
    /// The errors of each file set back, as it is (the first found).
    errors: BTreeMap<PathBuf, Vec<ConfigError>>,
    /// The first error of each copy set back.
    copy_errors: BTreeMap<PathBuf, String>,
    /// The files in the order they were first read.
    order: Vec<PathBuf>,
}

impl Compose {
    fn using(&self, file: &Path) -> Using {
        self.using.get(file).copied().unwrap_or(Using::AsIs)
    }

    fn copy(&self, file: &Path) -> Option<String> {
        read::read_config_file(&self.copies.join(copy_name(file)?)).ok()
    }

    /// The whole config with each file as `using` says.
    fn attempt(&mut self) -> Result<Config, Vec<ConfigError>> {
        let supd_only = self.using(&self.main) == Using::Nothing;
        let main = self.main.clone();
        load_from(&main, &mut |p| self.text(p), supd_only)
    }

    /// What stands for `file` now. An included file that cannot be read is set back at
    /// once (its error its own, not the include pattern's).
    fn text(&mut self, file: &Path) -> Result<String, String> {
        if !self.order.iter().any(|f| f == file) {
            self.order.push(file.to_path_buf());
        }
        let as_is = (self.texts)
            .entry(file.to_path_buf())
            .or_insert_with(|| read::read_config_file(file))
            .clone();
        match (self.using(file), as_is) {
            (Using::AsIs, Err(why)) if file != self.main => {
                let err = ConfigError {
                    file: file.to_path_buf(),
                    line: 0,
                    column: 0,
                    key: String::new(),
                    message: why,
                };
                self.step_back(file, vec![err]);
                self.text(file)
            }
            (Using::AsIs, t) => t,
            (Using::Copy, _) => Ok(self.copy(file).unwrap_or_default()),
            // The main file's `[supd]` (and nothing if it cannot be read).
            (Using::Nothing, t) if file == self.main => Ok(t.unwrap_or_default()),
            (Using::Nothing, _) => Ok(String::new()),
        }
    }

    /// The file to set back for errors found in `file`: a file as it is yields to a
    /// copy that stands in for another (a service moved out of a broken file is defined
    /// by the file it is in now, not by the stale copy); else `file` itself.
    fn culprit(&mut self, file: &Path) -> PathBuf {
        if self.using(file) != Using::AsIs {
            return file.to_path_buf();
        }
        let copies: Vec<PathBuf> = (self.using.iter())
            .filter(|(_, u)| **u == Using::Copy)
            .map(|(f, _)| f.clone())
            .collect();
        for other in copies {
            self.using.insert(other.clone(), Using::Nothing);
            let clears = match self.attempt() {
                Ok(_) => true,
                Err(errs) => errs.iter().all(|e| e.file != file),
            };
            self.using.insert(other.clone(), Using::Copy);
            if clears {
                return other;
            }
        }
        file.to_path_buf()
    }

    /// Sets `file` one step back; false when it is at nothing already.
    fn step_back(&mut self, file: &Path, errs: Vec<ConfigError>) -> bool {
        let next = match self.using(file) {
            Using::AsIs if self.copy(file).is_some() => Using::Copy,
            Using::AsIs => Using::Nothing,
            Using::Copy => {
                let first = errs.first().map_or_else(String::new, ToString::to_string);
                self.copy_errors.insert(file.to_path_buf(), first);
                Using::Nothing
            }
            Using::Nothing => return false,
        };
        self.using.insert(file.to_path_buf(), next);
        self.errors.entry(file.to_path_buf()).or_insert(errs);
        true
    }

    /// What no composition loads gives: the main file's `[supd]`, and no service.
    fn nothing_at_all(&mut self) -> Config {
        let supd: SupdConfig = super::load_supd_only(&self.main).unwrap_or_default();
        for f in self.order.clone() {
            self.using.insert(f, Using::Nothing);
        }
        Config {
            supd,
            services: BTreeMap::new(),
            leases: BTreeMap::new(),
            files: vec![self.main.clone()],
            origins: BTreeMap::new(),
        }
    }

    /// Each file set back, tried one step forward (as it is, else its copy) and kept
    /// there if the whole still loads.
    fn forward(&mut self, mut cfg: Config) -> Config {
        for file in self.order.clone() {
            let was = self.using(&file);
            let steps: &[Using] = match was {
                Using::AsIs => &[],
                Using::Copy => &[Using::AsIs],
                Using::Nothing => &[Using::AsIs, Using::Copy],
            };
            for &step in steps {
                let readable = match step {
                    Using::AsIs => self.texts.get(&file).is_some_and(|t| t.is_ok()),
                    _ => self.copy(&file).is_some(),
                };
                if !readable {
                    continue;
                }
                self.using.insert(file.clone(), step);
                if let Ok(c) = self.attempt() {
                    cfg = c;
                    if step == Using::AsIs {
                        self.using.remove(&file);
                        self.errors.remove(&file);
                    }
                    break;
                }
                self.using.insert(file.clone(), was);
            }
        }
        cfg
    }

    fn finish(mut self, cfg: Config) -> Loaded {
        let mut errors = Vec::new();
        let mut broken = Vec::new();
        for file in &cfg.files {
            let Some(errs) = self.errors.remove(file) else {
                continue;
            };
            let using = match self.using(file) {
                Using::Copy => "last good copy",
                _ => "nothing",
            };
            let first = errs.first().map(ToString::to_string).unwrap_or_default();
            let error = match errs.len() {
                0 | 1 => first,
                n => format!("{first} (and {} more)", n - 1),
            };
            broken.push(BrokenFile {
                file: file.clone(),
                error,
                using: using.into(),
            });
            errors.extend(errs);
        }
        let good = (cfg.files.iter())
            .filter(|f| self.using(f) == Using::AsIs)
            .filter_map(|f| Some((f.clone(), self.texts.get(f)?.clone().ok()?)))
            .collect();
        let unusable_copies = (broken.iter())
            .filter(|b| !b.has_copy())
            .filter_map(|b| {
                let why = self.copy_errors.get(&b.file).cloned().or_else(|| {
                    self.copy(&b.file)
                        .map(|_| "it clashes with the files as they are".to_string())
                })?;
                Some((b.file.clone(), why))
            })
            .collect();
        Loaded {
            cfg,
            errors,
            broken,
            good,
            unusable_copies,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> crate::scratch::Scratch {
        let d = crate::scratch::Scratch::new(&format!("lastgood-{name}"));
        std::fs::create_dir_all(d.join("services.d")).expect("mkdir");
        d
    }

    fn write(d: &Path, name: &str, text: &str) {
        std::fs::write(d.join(name), text).expect("write");
    }

    fn main_file(d: &Path) -> String {
        format!(
            "[supd]\nstate_dir = \"{}\"\ninclude = [\"services.d/*.toml\"]\n",
            d.join("state").display()
        )
    }

    const SVC: &str = "command = [\"/bin/true\"]\n";

    #[test]
    fn a_file_set_back_for_another_comes_forward_again() {
        let d = dir("after");
        write(&d, "sup.toml", &main_file(&d));
        // a.toml's service comes after b's: with b.toml broken and no copy, a.toml
        // cannot load either; once b.toml's copy exists, both run.
        write(
            &d,
            "services.d/a.toml",
            &format!("[service.a]\n{SVC}after = [\"b\"]\n"),
        );
        write(&d, "services.d/b.toml", &format!("[service.b]\n{SVC}"));
        write(&d, "services.d/c.toml", &format!("[service.c]\n{SVC}"));
        let l = load_at_start(&d.join("sup.toml"));
        assert!(l.broken.is_empty());
        keep(&d.join("state"), &l.good, true);
        write(&d, "services.d/b.toml", "[service.b\n");
        let l = load_at_start(&d.join("sup.toml"));
        let names: Vec<&String> = l.cfg.services.keys().collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(l.broken.len(), 1, "{:?}", l.broken);
        assert_eq!(l.broken[0].using, "last good copy");
        assert!(l.broken[0].error.contains("b.toml:1:"), "{:?}", l.broken);
        // Without the copy, a.toml goes with it; c.toml runs.
        std::fs::remove_dir_all(d.join("state")).expect("rm");
        let l = load_at_start(&d.join("sup.toml"));
        let names: Vec<&String> = l.cfg.services.keys().collect();
        assert_eq!(names, ["c"]);
        let files: Vec<String> = (l.broken.iter())
            .map(|b| format!("{} {}", b.file.display(), b.using))
            .collect();
        assert_eq!(l.broken.len(), 2, "{files:?}");
        assert!(l
            .errors
            .iter()
            .any(|e| e.message.contains("no service named 'b'")));
    }

    #[test]
    fn a_main_file_with_a_bad_supd_key_keeps_the_others_and_its_includes() {
        let d = dir("supd");
        let main = format!(
            "{}socket = \"x.sock\"\ncgroups = false\n[service.m]\n{SVC}",
            main_file(&d)
        );
        write(&d, "sup.toml", &main);
        write(&d, "services.d/a.toml", &format!("[service.a]\n{SVC}"));
        let l = load_at_start(&d.join("sup.toml"));
        assert_eq!(l.cfg.supd.socket, d.join("x.sock"));
        assert_eq!(l.cfg.supd.state_dir, d.join("state"));
        assert!(l.cfg.supd.cgroups, "the bad key at its default");
        let names: Vec<&String> = l.cfg.services.keys().collect();
        assert_eq!(
            names,
            ["a"],
            "nothing of the broken main file, its includes run"
        );
        assert_eq!(l.broken.len(), 1);
        assert!(
            l.errors[0].to_string().contains("supd.cgroups"),
            "{:?}",
            l.errors
        );
    }

    #[test]
    fn copies_are_named_by_the_escaped_path_and_kept_durably_when_they_change() {
        assert_eq!(
            copy_name(Path::new("/etc/sup/services.d/a%b.toml")).as_deref(),
            Some("%2Fetc%2Fsup%2Fservices.d%2Fa%25b.toml")
        );
        assert_eq!(
            copy_name(&PathBuf::from(format!("/{}", "x".repeat(300)))),
            None
        );
        let d = dir("keep");
        let (a, b) = (d.join("a.toml"), d.join("b.toml"));
        keep(
            &d,
            &[(a.clone(), "1".into()), (b.clone(), "2".into())],
            true,
        );
        let copy =
            |f: &Path| std::fs::read_to_string(d.join(DIR).join(copy_name(f).expect("name")));
        assert_eq!(
            (copy(&a).ok(), copy(&b).ok()),
            (Some("1".into()), Some("2".into()))
        );
        // A partial keep refreshes and forgets nothing else; a whole one forgets b.
        keep(&d, &[(a.clone(), "3".into())], false);
        assert_eq!(
            (copy(&a).ok(), copy(&b).ok()),
            (Some("3".into()), Some("2".into()))
        );
        keep(&d, &[(a.clone(), "3".into())], true);
        assert!(copy(&b).is_err());
    }

    #[test]
    fn an_unreadable_drop_in_is_its_own_error() {
        let d = dir("unreadable");
        write(&d, "sup.toml", &main_file(&d));
        std::os::unix::fs::symlink("/nonexistent/x", d.join("services.d/x.toml")).expect("ln");
        write(&d, "services.d/a.toml", &format!("[service.a]\n{SVC}"));
        let l = load_at_start(&d.join("sup.toml"));
        let names: Vec<&String> = l.cfg.services.keys().collect();
        assert_eq!(names, ["a"]);
        assert_eq!(l.broken.len(), 1);
        assert_eq!(l.broken[0].file, d.join("services.d/x.toml"));
    }
}
