//! A systemd user unit (`~/.config/systemd/user/stagefs.service`).

use std::path::PathBuf;

use super::{Plan, Service, answer_of};

const UNIT: &str = "stagefs.service";

/// The unit file and the commands that enable and start it.
pub(super) fn install_plan(service: &Service) -> anyhow::Result<Plan> {
    Ok(Plan {
        file: unit_path()?,
        content: unit(service),
        load: vec![
            systemctl(&["daemon-reload"]),
            systemctl(&["enable", "--now", UNIT]),
        ],
    })
}

/// The unit file and the commands that stop and disable it.
pub(super) fn uninstall_plan() -> anyhow::Result<(PathBuf, Vec<Vec<String>>)> {
    Ok((unit_path()?, vec![systemctl(&["disable", "--now", UNIT])]))
}

/// `enabled, active` as systemctl reports it, or why it cannot be asked.
pub(super) fn state() -> String {
    let ask = |verb: &str| match answer_of(&systemctl(&[verb, UNIT])) {
        Ok((_, out, _)) if !out.is_empty() => out,
        Ok((_, _, err)) => format!("unknown ({err})"),
        Err(e) => format!("unknown ({e:#})"),
    };
    format!("{}, {}", ask("is-enabled"), ask("is-active"))
}

/// The unit text. Restart-on-failure with a pause covers a NAS that is not yet
/// mounted at login: the mount refuses a missing source and is retried. SIGTERM
/// makes the daemon unmount, so no ExecStop is needed.
///
/// No stop timeout: with files open, SIGTERM detaches the mount at once (new opens
/// no longer see it) and the daemon serves the open files until they are closed,
/// then exits. A timeout would SIGKILL it under a model server still reading, whose
/// every read would then fail. A second SIGTERM (`systemctl --user kill stagefs`)
/// stops it at once, and a logout or shutdown stays bounded by the user manager's
/// own stop timeout (user@.service's).
pub(super) fn unit(service: &Service) -> String {
    let exec: Vec<String> = service.arguments().iter().map(|a| quote(a)).collect();
    format!(
        "# Written by `stagefs service install`; `stagefs service uninstall` removes it.\n\
         [Unit]\n\
         Description=stagefs: stage {source} at {mountpoint}\n\
         \n\
         [Service]\n\
         Type=exec\n\
         ExecStart={exec}\n\
         Restart=on-failure\n\
         RestartSec=30\n\
         # With files open, a stop waits until they are closed; `systemctl --user kill\n\
         # stagefs` stops at once (see `stagefs service install` in the README).\n\
         TimeoutStopSec=infinity\n\
         \n\
         [Install]\n\
         WantedBy=default.target\n",
        source = escape(&service.source.display().to_string()),
        mountpoint = escape(&service.mountpoint.display().to_string()),
        exec = exec.join(" "),
    )
}

fn unit_path() -> anyhow::Result<PathBuf> {
    Ok(crate::paths::config_home()?.join("systemd/user").join(UNIT))
}

fn systemctl(args: &[&str]) -> Vec<String> {
    ["systemctl", "--user"]
        .iter()
        .chain(args)
        .map(|s| s.to_string())
        .collect()
}

/// One ExecStart word: double-quoted, with systemd's escapes.
fn quote(word: &str) -> String {
    format!("\"{}\"", escape(word).replace('"', "\\\""))
}

/// `%` starts a specifier and `\` an escape in unit files.
fn escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('%', "%%")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_runs_the_configured_mount_in_the_foreground() {
        let unit = unit(&super::super::sample());
        assert!(unit.contains(
            "ExecStart=\"/opt/stage fs/bin/stagefs\" \"--config\" \"/home/ann/.config/stagefs/config.toml\" \"mount\" \"--foreground\"\n"
        ), "{unit}");
        assert!(unit.contains("Description=stagefs: stage /mnt/nas/hub at /home/ann/hf\n"));
        assert!(unit.contains("Restart=on-failure\n"));
        // A stop with a model still open waits for it to be closed, not 30 s.
        assert!(unit.contains("\nTimeoutStopSec=infinity\n"), "{unit}");
        assert!(unit.contains("[Install]\nWantedBy=default.target\n"));
    }

    #[test]
    fn specifiers_and_quotes_are_escaped() {
        assert_eq!(quote("/a b/100%\"x\\"), "\"/a b/100%%\\\"x\\\\\"");
    }
}
