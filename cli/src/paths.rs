//! Default locations.

use std::path::PathBuf;

use anyhow::{Context, bail};

/// `$XDG_CACHE_HOME/stagefs` or `~/.cache/stagefs` on Linux, `~/Library/Caches/stagefs` on macOS.
pub(crate) fn default_cache_dir() -> anyhow::Result<PathBuf> {
    if cfg!(target_os = "macos") {
        return Ok(home()?.join("Library/Caches/stagefs"));
    }
    match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) if !dir.is_empty() => Ok(PathBuf::from(dir).join("stagefs")),
        _ => Ok(home()?.join(".cache/stagefs")),
    }
}

/// `$XDG_CONFIG_HOME`, else `~/.config` (on macOS too: command-line tools keep their
/// config there, and systemd user units live below it).
pub(crate) fn config_home() -> anyhow::Result<PathBuf> {
    match std::env::var_os("XDG_CONFIG_HOME") {
        Some(dir) if !dir.is_empty() => Ok(PathBuf::from(dir)),
        _ => Ok(home()?.join(".config")),
    }
}

/// The user's home directory.
pub(crate) fn home() -> anyhow::Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set; pass --cache-dir")?;
    if home.is_empty() {
        bail!("HOME is empty; pass --cache-dir");
    }
    Ok(PathBuf::from(home))
}
