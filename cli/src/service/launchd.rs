//! A launchd agent (`~/Library/LaunchAgents/org.stagefs.mount.plist`).

use std::path::PathBuf;

use anyhow::Context;
use plist::{Dictionary, Value};
use stagefs_control::Backend;

use super::{Plan, Service, output_of};

const LABEL: &str = "org.stagefs.mount";

/// The agent file and the commands that load it into the login session.
pub(super) fn install_plan(service: &Service) -> anyhow::Result<Plan> {
    let file = agent_path()?;
    Ok(Plan {
        content: agent(service)?,
        load: vec![launchctl(&[
            "bootstrap",
            &domain(),
            &file.display().to_string(),
        ])],
        file,
    })
}

/// The agent file and the command that unloads it.
pub(super) fn uninstall_plan() -> anyhow::Result<(PathBuf, Vec<Vec<String>>)> {
    Ok((
        agent_path()?,
        vec![launchctl(&["bootout", &format!("{}/{LABEL}", domain())])],
    ))
}

/// `loaded` (with launchd's state line) or `not loaded`.
pub(super) fn state() -> String {
    match output_of(&launchctl(&["print", &format!("{}/{LABEL}", domain())])) {
        Ok(out) => out
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("state ="))
            .map_or_else(|| "loaded".into(), |l| format!("loaded, {l}")),
        Err(_) => "not loaded".into(),
    }
}

/// The agent's command line: the service's, naming the backend, so the agent file
/// says what it mounts with: NFS (no kernel extension) unless the config file named
/// another when it was installed.
fn arguments(service: &Service) -> Vec<String> {
    let backend = service.backend.unwrap_or(Backend::Nfs);
    let mut arguments = service.arguments();
    arguments.extend(["--backend".into(), backend.to_string()]);
    arguments
}

/// How long launchd waits after SIGTERM before it kills the agent. With files open,
/// the daemon keeps serving them until they are closed and then exits; launchd's
/// default (about 20 s) would kill it under a model server still reading. Not 0,
/// launchd's "forever", which Apple warns can stall a shutdown: at a logout the
/// programs holding models are quit too, and two minutes lets their files close.
const EXIT_TIMEOUT_SECS: i64 = 120;

/// The agent plist. RunAtLoad starts it at login; KeepAlive on an unsuccessful exit,
/// throttled, retries a NAS that is not mounted yet, while `stagefs unmount` (a clean
/// exit) stays stopped; ExitTimeOut is [`EXIT_TIMEOUT_SECS`].
pub(super) fn agent(service: &Service) -> anyhow::Result<String> {
    let mut keep_alive = Dictionary::new();
    keep_alive.insert("SuccessfulExit".into(), false.into());
    let log = Value::from(service.log.display().to_string());
    let mut agent = Dictionary::new();
    agent.insert("Label".into(), LABEL.into());
    agent.insert(
        "ProgramArguments".into(),
        Value::Array(arguments(service).into_iter().map(Value::from).collect()),
    );
    agent.insert("RunAtLoad".into(), true.into());
    agent.insert("KeepAlive".into(), keep_alive.into());
    agent.insert("ThrottleInterval".into(), 30.into());
    agent.insert("ExitTimeOut".into(), EXIT_TIMEOUT_SECS.into());
    agent.insert("StandardOutPath".into(), log.clone());
    agent.insert("StandardErrorPath".into(), log);
    let mut out = Vec::new();
    plist::to_writer_xml(&mut out, &Value::Dictionary(agent)).context("writing the agent plist")?;
    String::from_utf8(out).context("the agent plist is not UTF-8")
}

fn agent_path() -> anyhow::Result<PathBuf> {
    Ok(crate::paths::home()?.join(format!("Library/LaunchAgents/{LABEL}.plist")))
}

/// The login session's launchd domain.
fn domain() -> String {
    // SAFETY: getuid cannot fail.
    format!("gui/{}", unsafe { libc::getuid() })
}

fn launchctl(args: &[&str]) -> Vec<String> {
    std::iter::once("launchctl")
        .chain(args.iter().copied())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program_arguments(dict: &Dictionary) -> Vec<String> {
        let args = dict["ProgramArguments"].as_array().expect("array");
        args.iter()
            .filter_map(Value::as_string)
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn agent_runs_the_configured_mount_at_login_over_nfs() {
        let text = agent(&super::super::sample()).expect("plist");
        let value: Value = plist::from_bytes(text.as_bytes()).expect("parses back");
        let dict = value.as_dictionary().expect("a dictionary");
        assert_eq!(dict["Label"].as_string(), Some(LABEL));
        assert_eq!(
            program_arguments(dict),
            [
                "/opt/stage fs/bin/stagefs",
                "--config",
                "/home/ann/.config/stagefs/config.toml",
                "mount",
                "--foreground",
                "--backend",
                "nfs"
            ]
        );
        assert_eq!(dict["RunAtLoad"].as_boolean(), Some(true));
        let keep_alive = dict["KeepAlive"].as_dictionary().expect("dict");
        assert_eq!(keep_alive["SuccessfulExit"].as_boolean(), Some(false));
        // Not launchd's ~20 s default: a daemon serving an open model may finish.
        assert_eq!(dict["ExitTimeOut"].as_signed_integer(), Some(120));
        assert_eq!(
            dict["StandardErrorPath"].as_string(),
            Some("/home/ann/.cache/stagefs/stagefs.log")
        );
    }

    #[test]
    fn agent_keeps_a_backend_the_config_file_names() {
        let service = Service {
            backend: Some(Backend::Fuse),
            ..super::super::sample()
        };
        let text = agent(&service).expect("plist");
        let value: Value = plist::from_bytes(text.as_bytes()).expect("parses back");
        let args = program_arguments(value.as_dictionary().expect("a dictionary"));
        assert_eq!(args[args.len() - 2..], ["--backend", "fuse"]);
    }
}
