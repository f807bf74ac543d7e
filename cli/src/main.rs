//! `stagefs`: mount a slow HuggingFace cache and serve every opened weight file from a
//! complete local copy.

mod args;
mod config;
mod daemon;
mod demo;
mod doctor;
mod hfgen;
mod manage;
mod mounts;
mod paths;
mod prefetch;
mod run;
mod service;
mod units;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::FromArgMatches as _;
use stagefs_control::Remedy;
use stagefs_layout::models::ModelError;
use stagefs_policy::FsError;
use stagefs_stage::StageError;
use stagefs_store::StoreError;
use tracing_subscriber::EnvFilter;

use crate::args::{Cli, Command, GenDemoArgs, MountArgs};
use crate::config::Config;

fn main() -> ExitCode {
    let parsed = args::command()
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    init_logging(default_log_filter(&cli.command));
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("stagefs: {}", with_hint(&e));
            match e.downcast_ref::<args::UsageError>() {
                Some(_) => ExitCode::from(2),
                None => ExitCode::FAILURE,
            }
        }
    }
}

/// The error, and the flag to try when the core reports a condition a user can change.
/// The system's words stay ("No such file or directory"), its error numbers go.
fn with_hint(e: &anyhow::Error) -> String {
    let said = stagefs_source::without_os_error(&format!("{e:#}"));
    match remedy_of(e) {
        Some(remedy) => format!("{said}; {}", args::flag_hint(remedy)),
        None => said,
    }
}

fn remedy_of(e: &anyhow::Error) -> Option<Remedy> {
    e.chain().find_map(|cause| {
        let store = || cause.downcast_ref::<StoreError>()?.remedy();
        let stage = || cause.downcast_ref::<StageError>()?.remedy();
        let fs = || cause.downcast_ref::<FsError>()?.remedy();
        let model = || cause.downcast_ref::<ModelError>()?.remedy();
        store().or_else(stage).or_else(fs).or_else(model)
    })
}

/// Bad arguments get clap's message without its blank lines: what is missing, the
/// similar flag, the possible values, the usage line and where to read more. Help and
/// version print as usual.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit();
    }
    eprintln!("{}", usage_text(&e.render().to_string()));
    ExitCode::from(2)
}

/// clap's rendered error as `stagefs: WHAT` and the lines that say more, blank lines
/// dropped. The usage line and the pointer to `--help` come only with details (what is
/// missing, a similar flag, the possible values): a message complete in itself (a bad
/// size, two flags that conflict) stays one line.
fn usage_text(rendered: &str) -> String {
    let mut lines = rendered.lines().filter(|l| !l.trim().is_empty());
    let first = lines.next().unwrap_or("invalid arguments");
    let mut rest: Vec<&str> = lines.collect();
    if !rest.iter().any(|l| l.starts_with(char::is_whitespace)) {
        rest.clear();
    }
    let mut text = format!("stagefs: {}", first.trim_start_matches("error: "));
    for line in rest {
        text.push('\n');
        text.push_str(line);
    }
    text
}

/// The daemon logs what it stages; interactive commands only warnings. `RUST_LOG` overrides.
fn default_log_filter(command: &Command) -> &'static str {
    match command {
        // Only the daemon logs (to its log file); the launcher prints its own lines. The
        // NFS server library logs every JUKEBOX answer as an error; ours say more.
        Command::Mount(args) if args.foreground => {
            "warn,fuser=error,nfs3_server=off,stagefs=info,stagefs_source=info,stagefs_store=info,stagefs_layout=info,stagefs_stage=info,stagefs_policy=info,stagefs_fuse=info,stagefs_nfs=info,stagefs_mount=info"
        }
        Command::Serve(_) => {
            "warn,fuser=error,nfs3_server=off,stagefs=info,stagefs_source=info,stagefs_store=info,stagefs_layout=info,stagefs_stage=info,stagefs_policy=info,stagefs_fuse=info,stagefs_nfs=info,stagefs_mount=info"
        }
        _ => "warn,fuser=error",
    }
}

fn init_logging(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = || Config::load(cli.config.as_deref(), cli.no_config);
    // A command whose arguments name all it needs (`unmount PATH`, `status --cache-dir C`)
    // reads the file only for defaults: an error in it is a warning, not a stop.
    let config_unless = |given: bool| match config() {
        Err(e) if given => match e.downcast_ref::<config::ConfigError>() {
            Some(error) => {
                eprintln!("stagefs: warning: {error} (went on without the file)");
                Ok(Config::default())
            }
            None => Err(e),
        },
        loaded => loaded,
    };
    let by_cache = |cache: &args::CacheDirArg| config_unless(cache.cache_dir.is_some());
    match &cli.command {
        Command::Mount(args) => mount(args, &config()?),
        Command::Serve(args) => {
            let spec = config()?.serve_spec(
                args.source.as_deref(),
                args.listen,
                args.links,
                &args.options,
            )?;
            daemon::serve_nfs(&spec)
        }
        Command::Unmount(args) => {
            let config = config_unless(args.mountpoint.is_some())?;
            let mountpoint = mounts::mountpoint(&config, args.mountpoint.as_deref())?;
            let how = match (args.lazy, args.force) {
                (true, _) => stagefs_mount::UnmountHow::Lazy,
                (_, true) => stagefs_mount::UnmountHow::Force,
                _ => stagefs_mount::UnmountHow::Normal,
            };
            daemon::unmount(&mountpoint, how)
        }
        Command::Run(args) => return run::run(args, &config()?),
        // A broken config file is one of the things doctor reports, not a reason to stop.
        Command::Doctor(args) => {
            return match config() {
                Ok(config) => doctor::run(args, &config, None),
                Err(e) => match e.downcast_ref::<config::ConfigError>() {
                    Some(error) => doctor::run(args, &Config::default(), Some(error)),
                    None => Err(e),
                },
            };
        }
        Command::Service(command) => service::run(command, &config()?),
        Command::Status(args) => manage::status(args, &by_cache(&args.cache)?, cli.verbose),
        Command::Evict(args) => manage::evict(args, &by_cache(&args.cache)?, cli.verbose),
        Command::Verify(args) => manage::verify(args, &by_cache(&args.cache)?, cli.verbose),
        Command::Prefetch(args) => prefetch::run(args, &by_cache(&args.cache)?, cli.verbose),
        Command::Demo(args) => demo::run(args),
        Command::GenDemo(args) => gen_demo(args),
    }
    .map(|()| ExitCode::SUCCESS)
}

fn mount(args: &MountArgs, config: &Config) -> anyhow::Result<()> {
    let spec = config.mount_spec(
        args.source.as_deref(),
        args.mountpoint.as_deref(),
        &args.options(),
    )?;
    if daemon::already_up(&spec) {
        println!(
            "already mounted: {} at {} (cache {}); unmount it first to change its options",
            spec.source.display(),
            spec.mountpoint.display(),
            spec.cache_dir.display()
        );
        return Ok(());
    }
    if args.foreground {
        if args.cleared_stale_mount {
            tracing::info!(mountpoint = %spec.mountpoint.display(), "cleared a stale mount left by a crashed daemon");
        }
        daemon::serve_foreground(&spec, args.notify_ready)
    } else {
        let launched = daemon::launch_background(&spec)?;
        if launched.away {
            println!("stagefs: {}", daemon::away_line(&spec));
            return Ok(());
        }
        let log = launched.log;
        // One line: where it is mounted, and how programs find the models in it.
        let (source, dirs, timeout) = (&spec.source, &spec.model_dirs, spec.fs.source_timeout);
        let usage = stagefs_mount::bounded::shape_and_loose_models(source, dirs, timeout)
            .map(|(shape, loose)| {
                let (mnt, cache) = (&spec.mountpoint, Some(spec.cache_dir.as_path()));
                format!("; {}", doctor::shape_usage(shape, loose, mnt, cache))
            })
            .unwrap_or_default();
        println!("{}{usage}", daemon::describe(&spec, &log));
        if spec.max_size.is_some() {
            manage::warn_too_large(&spec.cache_dir);
        }
        Ok(())
    }
}

fn gen_demo(args: &GenDemoArgs) -> anyhow::Result<()> {
    let model = hfgen::generate(&args.dir, &args.repo, args.shards, args.shard_size)?;
    println!(
        "{}",
        serde_json::json!({
            "repo_dir": model.repo_dir,
            "commit": model.commit,
            "snapshot": args.dir.join(model.snapshot_rel()),
            "files": model.files.iter().map(|f| serde_json::json!({"name": f.name, "size": f.size})).collect::<Vec<_>>(),
        })
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use anyhow::Context as _;
    use stagefs_store::Budget;

    use super::*;

    fn usage_error_of(args: &[&str]) -> String {
        let e = args::command()
            .try_get_matches_from(args)
            .expect_err("a usage error");
        usage_text(&e.render().to_string())
    }

    #[test]
    fn usage_errors_keep_what_is_missing_the_suggestion_and_the_values() {
        assert_eq!(
            usage_error_of(&["stagefs", "prefetch"]),
            "stagefs: the following required arguments were not provided:\n  <TARGETS>...\nUsage: stagefs prefetch <TARGETS>...\nFor more information, try '--help'."
        );
        let typo = usage_error_of(&["stagefs", "mount", "/s", "/m", "--max-siz", "1G"]);
        assert!(
            typo.starts_with("stagefs: unexpected argument '--max-siz' found\n  tip: a similar argument exists: '--max-size'\n"),
            "{typo}"
        );
        assert_eq!(
            usage_error_of(&["stagefs", "mount", "/s", "/m", "--on-full", "foo"]),
            "stagefs: invalid value 'foo' for '--on-full <ON_FULL>'\n  [possible values: fail, read-source]\nFor more information, try '--help'."
        );
        let size = usage_error_of(&["stagefs", "mount", "/s", "/m", "--max-size", "lots"]);
        assert_eq!(size.lines().count(), 1, "{size}");
        let conflict = usage_error_of(&[
            "stagefs",
            "mount",
            "--no-prefetch",
            "--prefetch-parallel",
            "2",
        ]);
        assert_eq!(
            conflict,
            "stagefs: the argument '--no-prefetch' cannot be used with '--prefetch-parallel <PREFETCH_PARALLEL>'"
        );
    }

    #[test]
    fn the_cli_adds_the_flag_to_try_to_a_core_error() {
        let no_room = StoreError::NoRoom {
            path: PathBuf::from("o/m/model.safetensors"),
            needed: 3 << 20,
            budget: Budget {
                max_size: Some(2 << 20),
                min_free: None,
            },
            in_use: 0,
            available: 1 << 30,
        };
        assert!(!no_room.to_string().contains("--"), "{no_room}");
        let e = anyhow::Error::new(StageError::Store(no_room)).context("prefetching o/m");
        let line = with_hint(&e);
        assert!(
            line.starts_with("prefetching o/m: o/m/model.safetensors: needs 3.0 MiB"),
            "{line}"
        );
        assert!(
            line.contains("cannot make room (size limit 2.0 MiB, no free-space reserve;"),
            "{line}"
        );
        assert!(
            line.ends_with(
                "; raise --max-size, lower --min-free, free disk space, or close models in use"
            ),
            "{line}"
        );
        assert_eq!(line.lines().count(), 1);
        let model = ModelError::NoRevisions {
            id: "o/m".into(),
            kind: "GGUF file",
            path: "o/m.gguf".into(),
        };
        assert!(
            with_hint(&anyhow::Error::new(model))
                .ends_with("which has no revisions; drop --revision")
        );
        let plain: anyhow::Result<()> = Err(anyhow::anyhow!("no such thing")).context("looking");
        let plain = plain.expect_err("an error");
        assert_eq!(with_hint(&plain), "looking: no such thing");
    }
}
