//! The config file (`~/.config/stagefs/config.toml`): the mount a user runs every day,
//! so `stagefs mount`, `run`, `status` and `service` need no arguments. Flags override
//! it key by key; errors in it name the line and the key.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use stagefs_mount::{MountSpec, SourcePlace};
use stagefs_policy::FsConfig;
use stagefs_source::copy::CopyOptions;
use stagefs_stage::defaults;

use crate::args::{BackendArg, MountOptions, OnFullArg};
use crate::units::{parse_duration, parse_size, parse_source_dir};

/// Why the config file could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    /// It could not be read (a wrong path given to `--config` or `STAGEFS_CONFIG`).
    #[error("reading config file {}: {}", path.display(), stagefs_source::io_text(error))]
    Unreadable {
        /// The file named.
        path: PathBuf,
        /// What the system said (in the message, so not a source to print twice).
        error: std::io::Error,
    },
    /// A line of it is wrong: `what` names the line and the key.
    #[error("config file {}, {what}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The line, the key and what is wrong with it.
        what: String,
    },
}

impl ConfigError {
    /// What a user does about it.
    pub(crate) fn advice(&self) -> &'static str {
        match self {
            ConfigError::Unreadable { .. } => {
                "check the path given to --config or STAGEFS_CONFIG; the checks below ran without the file"
            }
            ConfigError::Invalid { .. } => {
                "fix that line (keys and values are the flags'; see the README); the checks below ran without the file"
            }
        }
    }
}

/// The keys a config file may hold; each is optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    #[serde(default, deserialize_with = "absolute_path")]
    source: Option<PathBuf>,
    #[serde(default, deserialize_with = "absolute_path")]
    mountpoint: Option<PathBuf>,
    #[serde(default, deserialize_with = "absolute_path")]
    cache_dir: Option<PathBuf>,
    #[serde(default, deserialize_with = "size")]
    max_size: Option<u64>,
    #[serde(default, deserialize_with = "size")]
    min_free: Option<u64>,
    #[serde(default, deserialize_with = "size")]
    min_stage_size: Option<u64>,
    on_full: Option<OnFullArg>,
    prefetch: Option<bool>,
    #[serde(default, deserialize_with = "count")]
    prefetch_parallel: Option<u16>,
    #[serde(default, deserialize_with = "count")]
    copy_streams: Option<u16>,
    #[serde(default, deserialize_with = "duration")]
    source_timeout: Option<u64>,
    passthrough: Option<bool>,
    redirect: Option<bool>,
    #[serde(default, deserialize_with = "duration")]
    redirect_grace: Option<u64>,
    allow_other: Option<bool>,
    read_only: Option<bool>,
    #[serde(default, deserialize_with = "source_dirs")]
    model_dirs: Option<Vec<PathBuf>>,
    backend: Option<BackendArg>,
}

/// The loaded config and where it came from.
#[derive(Debug, Clone, Default)]
pub(crate) struct Config {
    /// The file that was read; None when there is none (or `--no-config`).
    pub(crate) path: Option<PathBuf>,
    file: FileConfig,
}

impl Config {
    /// Reads `explicit` (`--config`), else `$STAGEFS_CONFIG`, else the default file if
    /// it exists. A file that was named but is missing is an error.
    pub(crate) fn load(explicit: Option<&Path>, disabled: bool) -> anyhow::Result<Config> {
        if disabled {
            return Ok(Config::default());
        }
        let named = explicit.map(Path::to_path_buf).or_else(|| {
            std::env::var_os("STAGEFS_CONFIG")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        let path = match named {
            Some(path) => path,
            None => match default_path() {
                Ok(path) if path.exists() => path,
                _ => return Ok(Config::default()),
            },
        };
        let text = std::fs::read_to_string(&path).map_err(|error| ConfigError::Unreadable {
            path: path.clone(),
            error,
        })?;
        let file = parse(&text).map_err(|e| ConfigError::Invalid {
            path: path.clone(),
            what: e.to_string(),
        })?;
        Ok(Config {
            path: Some(std::path::absolute(&path)?),
            file,
        })
    }

    /// The cache directory: the flag, the config file, or the platform default.
    pub(crate) fn cache_dir(&self, flag: Option<&Path>) -> anyhow::Result<PathBuf> {
        match flag.or(self.file.cache_dir.as_deref()) {
            Some(dir) => Ok(std::path::absolute(dir)?),
            None => crate::paths::default_cache_dir(),
        }
    }

    /// The config file's `cache_dir`, if it sets one.
    pub(crate) fn configured_cache_dir(&self) -> Option<&Path> {
        self.file.cache_dir.as_deref()
    }

    /// This config with the source, mount point and `model_dirs` a cache recorded
    /// filled in where the file sets none (for commands that find the mount a cache
    /// serves, or served last), and its budget where the file sets no budget key.
    pub(crate) fn filled_from(mut self, record: &stagefs_control::MountRecord) -> Config {
        let file = &mut self.file;
        if file.source.is_none() && file.mountpoint.is_none() {
            file.source = Some(record.source.clone());
            file.mountpoint = Some(record.mountpoint.clone());
            if file.model_dirs.is_none() {
                file.model_dirs = Some(record.model_dirs.clone());
            }
        }
        // The mount's budget is what its copies get, whichever way it was given.
        if file.max_size.is_none() && file.min_free.is_none() {
            (file.max_size, file.min_free) = (record.budget.max_size, record.budget.min_free);
        }
        self
    }

    /// The mount point: the argument or the config file.
    pub(crate) fn mountpoint(&self, arg: Option<&Path>) -> anyhow::Result<PathBuf> {
        self.required(arg, self.file.mountpoint.as_deref(), "mountpoint")
    }

    /// The configured source, if any (for `doctor`).
    pub(crate) fn source(&self) -> Option<&Path> {
        self.file.source.as_deref()
    }

    /// The file's budget keys, (max_size, min_free), for `doctor`.
    pub(crate) fn budget(&self) -> (Option<u64>, Option<u64>) {
        (self.file.max_size, self.file.min_free)
    }

    /// The configured mount point, if any (for `doctor`).
    pub(crate) fn configured_mountpoint(&self) -> Option<&Path> {
        self.file.mountpoint.as_deref()
    }

    /// The file's `backend`, if it sets one (for `doctor` and `service`).
    pub(crate) fn backend(&self) -> Option<stagefs_control::Backend> {
        self.file.backend.map(BackendArg::backend)
    }

    /// The file's `model_dirs` (for `doctor`).
    pub(crate) fn model_dirs(&self) -> &[PathBuf] {
        self.file.model_dirs.as_deref().unwrap_or_default()
    }

    /// The mount these arguments and the config file describe; flags win.
    pub(crate) fn mount_spec(
        &self,
        source: Option<&Path>,
        mountpoint: Option<&Path>,
        flags: &MountOptions,
    ) -> anyhow::Result<MountSpec> {
        // The source first: its absence is the first thing a newcomer hears about.
        let source = self.required(source, self.file.source.as_deref(), "source")?;
        let mountpoint = self.mountpoint(mountpoint)?;
        let mut spec = self.spec(Some(&source), mountpoint, flags)?;
        refuse_fuse_only_flags(flags, spec.backend)?;
        // The NFS client of a mount is this machine's: links to the copies reach them.
        spec.fs.nfs_links = spec.backend == stagefs_control::Backend::Nfs;
        Ok(spec)
    }

    /// The spec `stagefs serve` serves: NFS on `listen`, and no mount point.
    pub(crate) fn serve_spec(
        &self,
        source: Option<&Path>,
        listen: std::net::SocketAddr,
        links: bool,
        flags: &MountOptions,
    ) -> anyhow::Result<MountSpec> {
        refuse_fuse_only_flags(flags, stagefs_control::Backend::Nfs)?;
        let mut spec = self.spec(source, PathBuf::new(), flags)?;
        spec.backend = stagefs_control::Backend::Nfs;
        spec.nfs_listen = listen;
        spec.fs.nfs_links = links;
        Ok(spec)
    }

    fn spec(
        &self,
        source: Option<&Path>,
        mountpoint: PathBuf,
        flags: &MountOptions,
    ) -> anyhow::Result<MountSpec> {
        let file = &self.file;
        let source = self.required(source, file.source.as_deref(), "source")?;
        let cache_dir = self.cache_dir(flags.cache_dir.as_deref())?;
        if let Some(warning) = self.on_full_deprecation(flags.on_full) {
            eprintln!("stagefs: warning: {warning}");
        }
        let on_full = flags.on_full.or(file.on_full).map(OnFullArg::on_full);
        let prefetch = !flags.no_prefetch && file.prefetch.unwrap_or(defaults::PREFETCH);
        let prefetch_parallel = flags.prefetch_parallel.or(file.prefetch_parallel);
        let source_timeout = flags.source_timeout.or(file.source_timeout);
        let fs = FsConfig {
            min_stage_size: (flags.min_stage_size.or(file.min_stage_size))
                .unwrap_or(defaults::MIN_STAGE_SIZE),
            passthrough: !flags.no_passthrough && file.passthrough.unwrap_or(defaults::PASSTHROUGH),
            redirect: !flags.no_redirect && file.redirect.unwrap_or(defaults::REDIRECT),
            on_full: on_full.unwrap_or_default(),
            prefetch,
            prefetch_parallel: prefetch_parallel.map(usize::from),
            allow_other: flags.allow_other || file.allow_other.unwrap_or(defaults::ALLOW_OTHER),
            // An object store is served read-only (writing is not implemented): said
            // to the kernel too, so the mount is `ro` and `run` keeps loads offline.
            read_only: flags.read_only
                || file.read_only.unwrap_or(defaults::READ_ONLY)
                || SourcePlace::is_bucket(&source),
            source_timeout: source_timeout.map_or(defaults::SOURCE_TIMEOUT, |secs| {
                Duration::from_secs(secs.max(1))
            }),
            hint: Some(crate::args::flag_hint),
            ..FsConfig::default()
        };
        Ok(MountSpec {
            source,
            mountpoint,
            cache_dir,
            fs,
            max_size: flags.max_size.or(file.max_size),
            min_free: flags.min_free.or(file.min_free),
            redirect_grace: flags
                .redirect_grace
                .or(file.redirect_grace)
                .map_or(defaults::REDIRECT_GRACE, Duration::from_secs),
            copy: CopyOptions {
                streams: (flags.copy_streams.or(file.copy_streams))
                    .map_or(defaults::COPY_STREAMS, usize::from),
                ..CopyOptions::default()
            },
            model_dirs: if flags.model_dirs.is_empty() {
                self.model_dirs().to_vec()
            } else {
                flags.model_dirs.clone()
            },
            backend: flags
                .backend
                .or(file.backend)
                .map_or_else(BackendArg::platform_default, BackendArg::backend),
            ..MountSpec::new(PathBuf::new(), PathBuf::new(), PathBuf::new())
        })
    }

    /// The one-line warning for the old spelling of `--on-full read-source`, from
    /// the flag, or else from the config file when no flag overrides it.
    fn on_full_deprecation(&self, flag: Option<OnFullArg>) -> Option<String> {
        let new = OnFullArg::ReadSource.name();
        match (flag, self.file.on_full) {
            (Some(arg), _) if arg.is_deprecated() => Some(format!(
                "--on-full {} is deprecated; use --on-full {new}",
                arg.name()
            )),
            (None, Some(key)) if key.is_deprecated() => Some(format!(
                "on_full = \"{}\" in {} is deprecated; use on_full = \"{new}\"",
                key.name(),
                self.path
                    .as_ref()
                    .map_or("the config file".into(), |p| p.display().to_string())
            )),
            _ => None,
        }
    }

    fn required(
        &self,
        arg: Option<&Path>,
        file: Option<&Path>,
        key: &str,
    ) -> anyhow::Result<PathBuf> {
        match arg.or(file) {
            // An object store's URL is kept as written.
            Some(url) if SourcePlace::is_bucket(url) => Ok(url.to_path_buf()),
            // Absolute: the daemon may outlive the caller's working directory.
            Some(path) => Ok(std::path::absolute(path)?),
            None => bail!(
                "no {key} given: pass it on the command line or set `{key}` in {}",
                self.file_shown()
            ),
        }
    }

    /// The config file, as messages name it: the one read, else where it would be.
    pub(crate) fn file_shown(&self) -> String {
        match &self.path {
            Some(path) => path.display().to_string(),
            None => default_path().map_or_else(
                |_| "~/.config/stagefs/config.toml".into(),
                |p| p.display().to_string(),
            ),
        }
    }
}

/// `stagefs/config.toml` in the config home (`~/.config` unless `$XDG_CONFIG_HOME`).
pub(crate) fn default_path() -> anyhow::Result<PathBuf> {
    Ok(crate::paths::config_home()?.join("stagefs/config.toml"))
}

/// Parses a config file's text; the error names the line and the key.
fn parse(text: &str) -> Result<FileConfig, String> {
    toml::from_str(text).map_err(|e| locate(text, &e))
}

fn locate(text: &str, error: &toml::de::Error) -> String {
    let message = error.message().trim_end();
    let unknown = unknown_key(message);
    let Some(span) = error.span() else {
        return message.to_string();
    };
    let start = span.start.min(text.len());
    let line_number = text[..start].matches('\n').count() + 1;
    let line = text.lines().nth(line_number - 1).unwrap_or_default();
    if let Some(key) = unknown {
        return format!("line {line_number}: {}", unknown_key_said(key));
    }
    match line.split_once('=') {
        Some((key, _)) if !key.trim().is_empty() => {
            format!("line {line_number}, key `{}`: {message}", key.trim())
        }
        _ => format!("line {line_number}: {message}"),
    }
}

/// The keys a config file may hold, as `FileConfig` names them (a test checks they agree).
const KEYS: [&str; 18] = [
    "source",
    "mountpoint",
    "cache_dir",
    "max_size",
    "min_free",
    "min_stage_size",
    "on_full",
    "prefetch",
    "prefetch_parallel",
    "copy_streams",
    "source_timeout",
    "passthrough",
    "redirect",
    "redirect_grace",
    "allow_other",
    "read_only",
    "model_dirs",
    "backend",
];

/// The key serde's "unknown field `KEY`, expected one of …" names.
fn unknown_key(message: &str) -> Option<&str> {
    message
        .strip_prefix("unknown field `")?
        .split_once('`')
        .map(|(key, _)| key)
}

/// `unknown key `max_siz`; did you mean `max_size`?`, or the keys there are when none
/// is close: the whole list of 18 is a haystack for a one-letter typo.
fn unknown_key_said(key: &str) -> String {
    let closest = KEYS
        .iter()
        .map(|known| (edit_distance(key, known), *known))
        .min()
        .filter(|(distance, known)| *distance <= 2.max(known.len() / 3));
    match closest {
        Some((_, known)) => format!("unknown key `{key}`; did you mean `{known}`?"),
        None => format!(
            "unknown key `{key}`; the keys are the flags' long names with _: {}",
            KEYS.join(", ")
        ),
    }
}

/// Levenshtein distance: the fewest single-character insertions, deletions and
/// substitutions that turn `a` into `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substituted = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substituted.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

fn absolute_path<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
    let text = String::deserialize(d)?;
    let path = match text.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            let home = crate::paths::home().map_err(de::Error::custom)?;
            home.join(rest.trim_start_matches('/'))
        }
        _ => PathBuf::from(&text),
    };
    if !path.is_absolute() && !SourcePlace::is_bucket(&path) {
        return Err(de::Error::custom(format!(
            "'{text}' must be an absolute path (or start with ~/)"
        )));
    }
    Ok(Some(path))
}

fn source_dirs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<PathBuf>>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|text| parse_source_dir(text).map_err(de::Error::custom))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    d.deserialize_any(Text(parse_size, "a size such as 200G or a byte count"))
        .map(Some)
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    d.deserialize_any(Text(parse_duration, "a duration such as \"45s\" or \"2m\""))
        .map(Some)
}

fn count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
    let n = i64::deserialize(d)?;
    match u16::try_from(n) {
        Ok(n @ 1..=64) => Ok(Some(n)),
        _ => Err(de::Error::custom(format!("{n} is not in 1..=64"))),
    }
}

/// A value written as text and parsed by one of the flag parsers, so the file and
/// the command line accept exactly the same spellings (a bare integer counts too).
struct Text(fn(&str) -> Result<u64, String>, &'static str);

impl Visitor<'_> for Text {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.1)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        (self.0)(v).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        (self.0)(&v.to_string()).map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        (self.0)(&v.to_string()).map_err(E::custom)
    }
}

/// Refuses the flags only a FUSE mount has (kernel passthrough, links to copies,
/// other users) on an NFS export (`serve`, `--backend nfs`), where they would be
/// taken and do nothing: the NFS server reads every file itself and serves only the
/// mounting user and root. The config file's keys are left alone: one file may
/// serve both backends.
fn refuse_fuse_only_flags(
    flags: &MountOptions,
    backend: stagefs_control::Backend,
) -> anyhow::Result<()> {
    let given = flags.fuse_only_flags();
    if backend != stagefs_control::Backend::Nfs || given.is_empty() {
        return Ok(());
    }
    let (names, what) = match given.as_slice() {
        [one] => (one.to_string(), "is a FUSE mount's option"),
        [rest @ .., last] => (
            format!("{} and {last}", rest.join(", ")),
            "are FUSE mount options",
        ),
        [] => unreachable!("checked above"),
    };
    let them = if given.len() == 1 { "it" } else { "them" };
    Err(crate::args::UsageError(format!(
        "{names} {what}: an NFS export (`serve`, `--backend nfs`) reads every file itself and serves only its user and root; leave {them} out"
    ))
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> String {
        parse(text).expect_err("should be refused")
    }

    #[test]
    fn reads_every_key() {
        let file = parse(
            r#"
source = "/Volumes/nas/hub"
mountpoint = "/tmp/hf"
cache_dir = "/var/cache/stagefs"
max_size = "200G"
min_free = 1073741824
min_stage_size = "4M"
on_full = "passthrough"
prefetch = false
prefetch_parallel = 2
copy_streams = 8
source_timeout = "2m"
passthrough = false
redirect = false
redirect_grace = "10s"
allow_other = true
read_only = true
model_dirs = ["teams/nlp/hf/hub", "lmstudio/models/"]
"#,
        )
        .expect("valid");
        assert_eq!(file.max_size, Some(200 << 30));
        assert_eq!(file.min_free, Some(1 << 30));
        assert_eq!(file.source_timeout, Some(120));
        assert_eq!(file.on_full, Some(OnFullArg::Passthrough));
        assert_eq!(file.copy_streams, Some(8));
        assert_eq!(file.redirect, Some(false));
        assert_eq!(file.redirect_grace, Some(10));
        assert_eq!(file.read_only, Some(true));
        assert_eq!(
            file.model_dirs,
            Some(vec![
                PathBuf::from("teams/nlp/hf/hub"),
                PathBuf::from("lmstudio/models")
            ])
        );
    }

    #[test]
    fn keys_are_the_ones_serde_knows() {
        let e = toml::from_str::<FileConfig>("nope = 1").expect_err("unknown");
        let expected = e
            .message()
            .split_once("expected one of ")
            .expect("a list")
            .1;
        let listed: Vec<&str> = expected
            .trim()
            .split(", ")
            .map(|k| k.trim_matches('`'))
            .collect();
        assert_eq!(listed, KEYS);
    }

    #[test]
    fn errors_name_line_and_key() {
        let e = error("source = \"/a\"\nmax_size = \"20X\"\n");
        assert!(e.starts_with("line 2, key `max_size`:"), "{e}");
        assert!(e.contains("unknown size suffix"), "{e}");
        let e = error("# comment\n\nmax_sise = \"20G\"\n");
        assert_eq!(
            e,
            "line 3: unknown key `max_sise`; did you mean `max_size`?"
        );
        let e = error("mountpiont = \"/m\"\n");
        assert_eq!(
            e,
            "line 1: unknown key `mountpiont`; did you mean `mountpoint`?"
        );
        let e = error("colour = \"blue\"\n");
        assert!(
            e.starts_with("line 1: unknown key `colour`; the keys are"),
            "{e}"
        );
        assert!(e.ends_with("model_dirs, backend"), "{e}");
        let e = error("mountpoint = \"relative/dir\"\n");
        assert!(e.contains("must be an absolute path"), "{e}");
        let e = error("copy_streams = 0\n");
        assert!(e.starts_with("line 1, key `copy_streams`"), "{e}");
        let e = error("on_full = \"maybe\"\n");
        assert!(e.contains("on_full"), "{e}");
        let e = error("model_dirs = [\"/abs/hub\"]\n");
        assert!(e.starts_with("line 1, key `model_dirs`"), "{e}");
        assert!(e.contains("inside the source, relative to it"), "{e}");
        let e = error("source = \n");
        assert!(e.starts_with("line 1"), "{e}");
    }

    #[test]
    fn flags_override_the_file() {
        let config = Config {
            path: None,
            file: parse(
                "source = \"/src\"\nmountpoint = \"/mnt\"\nmax_size = \"10G\"\ncopy_streams = 8\npassthrough = false\n",
            )
            .expect("valid"),
        };
        let flags = MountOptions {
            max_size: Some(5 << 30),
            cache_dir: Some("/cache".into()),
            ..MountOptions::default()
        };
        let spec = config
            .mount_spec(Some(Path::new("/other")), None, &flags)
            .expect("spec");
        assert_eq!(spec.source, Path::new("/other"));
        assert_eq!(spec.mountpoint, Path::new("/mnt"));
        assert_eq!(spec.cache_dir, Path::new("/cache"));
        assert_eq!(spec.max_size, Some(5 << 30));
        assert_eq!(spec.copy.streams, 8);
        assert!(!spec.fs.passthrough);
        assert_eq!(spec.fs.min_stage_size, 1 << 20);
        assert!(spec.fs.redirect);
        assert_eq!(spec.redirect_grace, defaults::REDIRECT_GRACE);
        let flags = MountOptions {
            no_redirect: true,
            redirect_grace: Some(5),
            ..MountOptions::default()
        };
        let spec = config.mount_spec(None, None, &flags).expect("spec");
        assert!(!spec.fs.redirect);
        assert_eq!(spec.redirect_grace, Duration::from_secs(5));
    }

    #[test]
    fn unset_keys_fall_back_to_the_defaults_table() {
        let config = Config::default();
        let spec = config
            .mount_spec(
                Some(Path::new("/s")),
                Some(Path::new("/m")),
                &MountOptions {
                    cache_dir: Some("/c".into()),
                    ..MountOptions::default()
                },
            )
            .expect("spec");
        assert_eq!(spec.fs.min_stage_size, defaults::MIN_STAGE_SIZE);
        assert_eq!(spec.fs.source_timeout, defaults::SOURCE_TIMEOUT);
        assert_eq!(spec.fs.prefetch, defaults::PREFETCH);
        assert_eq!(spec.fs.prefetch_parallel, None, "by the source's kind");
        assert_eq!(spec.fs.passthrough, defaults::PASSTHROUGH);
        assert_eq!(spec.fs.redirect, defaults::REDIRECT);
        assert_eq!(spec.fs.allow_other, defaults::ALLOW_OTHER);
        assert_eq!(spec.fs.read_only, defaults::READ_ONLY);
        assert_eq!(spec.fs.on_full, stagefs_policy::OnFull::Fail);
        assert_eq!(spec.copy.streams, defaults::COPY_STREAMS);
        assert_eq!(spec.redirect_grace, defaults::REDIRECT_GRACE);
        assert_eq!((spec.max_size, spec.min_free), (None, None));
        assert!(
            spec.fs.hint.is_some(),
            "the daemon's log names the flags to try"
        );
    }

    #[test]
    fn on_full_read_source_and_its_old_spelling_in_the_file() {
        let in_file = |value: &str| Config {
            path: Some("/etc/stagefs.toml".into()),
            file: parse(&format!("on_full = \"{value}\"\n")).expect("valid"),
        };
        let spec = |config: &Config, flag| {
            let flags = MountOptions {
                on_full: flag,
                cache_dir: Some("/c".into()),
                ..MountOptions::default()
            };
            let spec = config.mount_spec(Some(Path::new("/s")), Some(Path::new("/m")), &flags);
            spec.expect("spec").fs.on_full
        };
        let new = in_file("read-source");
        assert_eq!(new.file.on_full, Some(OnFullArg::ReadSource));
        assert_eq!(spec(&new, None), stagefs_policy::OnFull::ReadSource);
        assert_eq!(new.on_full_deprecation(None), None);
        let old = in_file("passthrough");
        assert_eq!(spec(&old, None), stagefs_policy::OnFull::ReadSource);
        let warning = old.on_full_deprecation(None).expect("warns");
        assert_eq!(
            warning,
            "on_full = \"passthrough\" in /etc/stagefs.toml is deprecated; use on_full = \"read-source\""
        );
        // A flag overrides the file, and only a deprecated flag warns.
        assert_eq!(old.on_full_deprecation(Some(OnFullArg::Fail)), None);
        assert_eq!(
            spec(&old, Some(OnFullArg::Fail)),
            stagefs_policy::OnFull::Fail
        );
        let warning = new.on_full_deprecation(Some(OnFullArg::Passthrough));
        assert_eq!(
            warning.as_deref(),
            Some("--on-full passthrough is deprecated; use --on-full read-source")
        );
        assert!(error("on_full = \"read_source\"\n").contains("read-source"));
    }

    #[test]
    fn missing_source_says_where_to_set_it() {
        let e = Config::default()
            .mount_spec(None, Some(Path::new("/mnt")), &MountOptions::default())
            .expect_err("no source");
        assert!(e.to_string().contains("set `source` in"), "{e}");
    }
}
