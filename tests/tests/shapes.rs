//! The three shapes of source people mount (issue #10): an HF_HOME, a hub cache, and
//! a folder of plain model folders. For each, every command (status, prefetch,
//! evict, verify, doctor, run --model) and the sibling prefetch on open name the
//! model and stage its bytes right, on a real mount; then the clients that use each
//! shape (huggingface_hub with HF_HOME, safetensors by path) and a lone GGUF file.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use stagefs_tests::{
    HF_HOME_TOKEN, Layout, Mount, Scratch, ShapedSource, is_mounted, python, run_stagefs,
    staged_files_of_at_least, stagefs_bin, staging_order, status_json, wait_for, workspace_root,
};

/// The model every test uses; commands name it the same way in every layout (a
/// plain folder is found by the end of its path, `models/acme/shaped`).
const ID: &str = "acme/shaped";
const SHARDS: usize = 3;
/// Above the default --min-stage-size, so every shard is staged.
const SHARD_SIZE: &str = "2M";
const MIB: u64 = 1 << 20;

/// A mounted source in `layout`, with `flags`.
fn mounted(layout: Layout, flags: &[&str]) -> (Scratch, ShapedSource, Mount) {
    let s = Scratch::new();
    let src = ShapedSource::generate(&s, layout, ID, SHARDS, SHARD_SIZE);
    let mount = Mount::start(&src.root, &s.mnt, &s.cache, flags);
    (s, src, mount)
}

/// How `status` names the model: its repository id, or the folder's path.
fn status_name(src: &ShapedSource) -> String {
    match src.layout {
        Layout::HfHome | Layout::HubCache => ID.to_string(),
        Layout::PlainFolder => src.model_dir.display().to_string(),
    }
}

/// Every shard read through the mount has the source's bytes.
fn assert_bytes_right(src: &ShapedSource, mount: &Mount) {
    for name in src.shard_names() {
        let mounted = fs::read(mount.path(src.file(&name))).expect("read through the mount");
        assert!(
            mounted == src.bytes(&name),
            "{name} differs from the source"
        );
    }
}

fn staged_shards(s: &Scratch) -> usize {
    staged_files_of_at_least(&s.cache, MIB).len()
}

fn cache_arg(s: &Scratch) -> [&dyn AsRef<std::ffi::OsStr>; 2] {
    [&"--cache-dir", &s.cache]
}

/// `stagefs ARGS... --cache-dir CACHE`, returning (success, stdout, stderr).
fn stagefs_on(s: &Scratch, args: &[&dyn AsRef<std::ffi::OsStr>]) -> (bool, String, String) {
    let mut all: Vec<&dyn AsRef<std::ffi::OsStr>> = args.to_vec();
    all.extend(cache_arg(s));
    run_stagefs(&all)
}

/// The model named `name` in a `status --json` report.
fn model_status<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["models"]
        .as_array()
        .and_then(|models| models.iter().find(|m| m["model"] == name))
        .unwrap_or_else(|| panic!("status names no model {name}: {status:#}"))
}

fn sibling_prefetch_on_open(layout: Layout) {
    let (s, src, mount) = mounted(layout, &["--prefetch-parallel", "1"]);
    let shards = src.shard_names();
    File::open(mount.path(src.file(&shards[0]))).expect("open the first shard");
    wait_for("the other shards prefetched", || {
        staged_shards(&s) == SHARDS
    });
    let order: Vec<PathBuf> = staging_order(&mount.log_text())
        .into_iter()
        .filter(|p| shards.iter().any(|n| src.stored_path(n) == *p))
        .collect();
    let expected: Vec<PathBuf> = shards.iter().map(|n| src.stored_path(n)).collect();
    assert_eq!(
        order, expected,
        "the opened shard, then the others in shard order"
    );
    assert_bytes_right(&src, &mount);
    assert_eq!(
        mount.metrics().stage_copies,
        SHARDS as u64,
        "no shard copied twice"
    );
}

fn status(layout: Layout) {
    let (s, src, mount) = mounted(layout, &[]);
    File::open(mount.path(src.file(&src.shard_names()[0]))).expect("open a shard");
    // The copies on disk, then their entries: status lists a copy once it is recorded.
    let name = status_name(&src);
    wait_for("the model staged", || {
        staged_shards(&s) == SHARDS
            && model_status(&status_json(&s.cache), &name)["staged_files"] == SHARDS
    });
    let report = status_json(&s.cache);
    let model = model_status(&report, &status_name(&src));
    assert_eq!(model["staged_files"], SHARDS, "{model:#}");
    assert_eq!(model["staged_bytes"], src.shard_bytes(), "{model:#}");
    match layout {
        Layout::HfHome | Layout::HubCache => {
            assert_eq!(model["kind"], "hf_repo");
            let revision = &model["revisions"][0];
            assert_eq!(revision["revision"], src.model.commit.as_str(), "{model:#}");
            assert_eq!(revision["refs"][0], "main");
            assert_eq!(revision["staged_files"], SHARDS);
            let repo = src.model_dir.ancestors().nth(2).expect("repository dir");
            assert_eq!(model["path"], repo.display().to_string(), "{model:#}");
        }
        Layout::PlainFolder => {
            assert_eq!(model["kind"], "folder");
            assert_eq!(model["path"], src.model_dir.display().to_string());
            assert_eq!(model["total_files"], src.model.files.len(), "{model:#}");
        }
    }
    let (ok, text, err) = stagefs_on(&s, &[&"status"]);
    assert!(ok, "{err}");
    assert!(
        text.contains(&format!("model     {}", status_name(&src))),
        "{text}"
    );
    assert_bytes_right(&src, &mount);
}

fn prefetch(layout: Layout) {
    let (s, src, mount) = mounted(layout, &["--no-prefetch"]);
    let (ok, out, err) = stagefs_on(&s, &[&"prefetch", &ID]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("3 staged, 0 already staged, 0 failed"),
        "{out}"
    );
    assert_eq!(staged_shards(&s), SHARDS);
    // By path too: the model's directory through the mount.
    let (ok, out, err) = stagefs_on(&s, &[&"prefetch", &mount.path(&src.model_dir)]);
    assert!(
        ok && out.contains("0 staged, 3 already staged"),
        "{out}{err}"
    );
    assert_bytes_right(&src, &mount);
    assert_eq!(
        mount.metrics().stage_copies,
        SHARDS as u64,
        "reads found every copy"
    );
}

fn evict(layout: Layout) {
    let (s, src, mount) = mounted(layout, &["--no-prefetch"]);
    let (ok, out, err) = stagefs_on(&s, &[&"prefetch", &ID]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = stagefs_on(&s, &[&"evict", &ID]);
    assert!(ok, "{out}{err}");
    // The shards, and the small files the prefetch kept (config, index: what loading
    // offline needs).
    assert!(out.contains("evicted 5 files"), "{out}");
    // Named as users know them: a repository's files by the snapshot's names.
    for name in src.shard_names() {
        let line = match layout {
            Layout::PlainFolder => format!("evicted {}", src.stored_path(&name).display()),
            _ => format!("evicted {ID}: {name}"),
        };
        assert!(out.contains(&line), "{line} in {out}");
    }
    assert_eq!(staged_shards(&s), 0);
    assert_bytes_right(&src, &mount);
    assert_eq!(staged_shards(&s), SHARDS, "staged again by the reads");
}

fn verify(layout: Layout) {
    let (s, src, mount) = mounted(layout, &["--no-prefetch"]);
    let (ok, out, err) = stagefs_on(&s, &[&"prefetch", &ID]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = stagefs_on(&s, &[&"verify", &ID]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("checked 5 staged files"), "{out}");
    assert!(out.contains("0 mismatches"), "{out}");
    let victim = staged_files_of_at_least(&s.cache, MIB).remove(0);
    let mut bytes = fs::read(&victim).expect("read copy");
    bytes[4096] ^= 0x01;
    fs::write(&victim, bytes).expect("corrupt the copy");
    let (ok, out, _) = stagefs_on(&s, &[&"verify", &ID]);
    assert!(!ok && out.contains("MISMATCH"), "{out}");
    let (ok, out, err) = stagefs_on(&s, &[&"verify", &"--repair", &ID]);
    assert!(ok && out.contains("dropped"), "{out}{err}");
    assert_eq!(staged_shards(&s), SHARDS - 1);
    assert_bytes_right(&src, &mount);
}

/// `stagefs --config CONFIG doctor ARGS --json` with only `env` among the HF variables.
fn doctor(config: &Path, args: &[&dyn AsRef<std::ffi::OsStr>], env: &[(&str, &Path)]) -> Value {
    let mut command = Command::new(stagefs_bin());
    command
        .arg("--config")
        .arg(config)
        .arg("doctor")
        .args(args.iter().map(|a| a.as_ref()))
        .arg("--json");
    for name in [
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HOME",
        "STAGEFS_CONFIG",
    ] {
        command.env_remove(name);
    }
    command.envs(env.iter().copied());
    let out = command.output().expect("running doctor");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .and_then(|checks| checks.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no `{name}` check in {report:#}"))
}

fn doctor_checks(layout: Layout) {
    let (s, src, mount) = mounted(layout, &[]);
    let config = s.dir.path().join("config.toml");
    let text = format!(
        "source = {:?}\nmountpoint = {:?}\ncache_dir = {:?}\n",
        src.root.display().to_string(),
        s.mnt.display().to_string(),
        s.cache.display().to_string()
    );
    fs::write(&config, text).expect("config file");
    let elsewhere = s.dir.path().join("elsewhere");
    let report = doctor(&config, &[&ID], &[("HF_HUB_CACHE", &elsewhere)]);
    let (shape, json_shape) = match layout {
        Layout::HfHome => ("an HF_HOME", "hf_home"),
        Layout::HubCache => ("a hub cache", "hub_cache"),
        Layout::PlainFolder => ("plain model folder, loaded by path", "model_folders"),
    };
    let found = check(&report, "shape");
    assert_eq!(found["verdict"], "ok", "{report:#}");
    assert!(
        found["summary"].as_str().is_some_and(|t| t.contains(shape)),
        "{found:#}"
    );
    assert_eq!(report["hub_cache"]["shape"], json_shape, "{report:#}");
    let total: u64 = src.model.files.iter().map(|f| f.size).sum();
    assert_eq!(report["model"]["id"], status_name(&src), "{report:#}");
    assert_eq!(report["model"]["size_bytes"], total, "{report:#}");
    let hub = check(&report, "hub-cache");
    let advice = hub["advice"].as_str().unwrap_or_default();
    let mnt = s.mnt.display();
    match layout {
        Layout::HfHome => {
            assert_eq!(hub["verdict"], "warn", "{hub:#}");
            assert!(
                advice.starts_with(&format!("export HF_HOME={mnt} and unset HF_HUB_CACHE")),
                "{advice}"
            );
            let right = doctor(&config, &[], &[("HF_HOME", &s.mnt)]);
            assert_eq!(check(&right, "hub-cache")["verdict"], "ok", "{right:#}");
            assert!(check(&right, "hub-cache")["advice"].is_null(), "{right:#}");
        }
        Layout::HubCache => {
            assert_eq!(hub["verdict"], "warn", "{hub:#}");
            assert!(
                advice.starts_with(&format!("export HF_HUB_CACHE={mnt}")),
                "{advice}"
            );
            // HF_HOME=<mount> would look for the models in <mount>/hub.
            let wrong = doctor(&config, &[], &[("HF_HOME", &s.mnt)]);
            assert_eq!(check(&wrong, "hub-cache")["verdict"], "warn", "{wrong:#}");
            let right = doctor(&config, &[], &[("HF_HUB_CACHE", &s.mnt)]);
            assert_eq!(check(&right, "hub-cache")["verdict"], "ok", "{right:#}");
        }
        Layout::PlainFolder => {
            assert_eq!(hub["verdict"], "note", "{hub:#}");
            assert!(
                hub["summary"]
                    .as_str()
                    .is_some_and(|t| t.contains("loaded by path"))
            );
        }
    }
    // The mount itself: its source's shape, read without staging anything.
    let through = doctor(&config, &[&s.mnt], &[]);
    let found = check(&through, "shape");
    assert!(
        found["summary"].as_str().is_some_and(|t| t.contains(shape)),
        "{through:#}"
    );
    assert_eq!(mount.metrics().stage_copies, 0, "doctor staged nothing");
}

fn run_model(layout: Layout) {
    let s = Scratch::new();
    let src = ShapedSource::generate(&s, layout, ID, SHARDS, SHARD_SIZE);
    let _unmount = Unmount(s.mnt.clone());
    let show = "echo \"${HF_HOME-unset}|${HF_HUB_CACHE-unset}|${HF_HUB_OFFLINE-unset}\"";
    let out: Output = Command::new(stagefs_bin())
        .args(["--no-config", "run", "--source"])
        .arg(&src.root)
        .arg("--mountpoint")
        .arg(&s.mnt)
        .arg("--cache-dir")
        .arg(&s.cache)
        // A hub cache mounted read-only: loads must not try to download (below).
        .args(if layout == Layout::HubCache {
            &["--read-only"][..]
        } else {
            &[]
        })
        .args(["--model", ID, "--", "sh", "-c", show])
        .env_remove("HF_HOME")
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_HUB_OFFLINE")
        .output()
        .expect("stagefs run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(
        staged_shards(&s),
        SHARDS,
        "staged before COMMAND ran: {err}"
    );
    let mnt = s.mnt.display();
    let (env, said) = match layout {
        // Writable: online, so a load may download a newer revision through the mount.
        Layout::HfHome => (
            format!("{mnt}|{mnt}/hub|unset"),
            format!(
                "running with HF_HOME={mnt} HF_HUB_CACHE={mnt}/hub HF_XET_CACHE={}/xet",
                s.cache.display()
            ),
        ),
        Layout::HubCache => (
            format!("unset|{mnt}|1"),
            format!("running with HF_HUB_CACHE={mnt} HF_HUB_OFFLINE=1"),
        ),
        Layout::PlainFolder => (
            "unset|unset|unset".to_string(),
            format!(
                "running with no HF variables set: the source holds plain model folders, load them by path under {mnt}"
            ),
        ),
    };
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), env);
    assert_eq!(
        err.lines().filter(|l| l.contains("running with")).count(),
        1,
        "one line: {err}"
    );
    assert!(err.contains(&said), "{said} in {err}");
    for name in src.shard_names() {
        let mounted = fs::read(s.mnt.join(src.file(&name))).expect("read through the mount");
        assert!(mounted == src.bytes(&name), "{name}");
    }
}

/// Unmounts a background mount when the test ends, even a failing one.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new(stagefs_bin())
            .args(["--no-config", "unmount", "--lazy"])
            .arg(&self.0)
            .output();
    }
}

/// One test per (layout, command): `hf_home::status`, `plain_folder::run_model`, ...
macro_rules! matrix {
    ($($module:ident => $layout:expr),* $(,)?) => {$(
        mod $module {
            use super::*;

            #[test]
            fn sibling_prefetch_on_open() {
                super::sibling_prefetch_on_open($layout);
            }

            #[test]
            fn status() {
                super::status($layout);
            }

            #[test]
            fn prefetch() {
                super::prefetch($layout);
            }

            #[test]
            fn evict() {
                super::evict($layout);
            }

            #[test]
            fn verify() {
                super::verify($layout);
            }

            #[test]
            fn doctor() {
                super::doctor_checks($layout);
            }

            #[test]
            fn run_model() {
                super::run_model($layout);
            }
        }
    )*};
}

matrix! {
    hf_home => Layout::HfHome,
    hub_cache => Layout::HubCache,
    plain_folder => Layout::PlainFolder,
}

#[test]
fn mount_says_what_to_export_for_each_shape() {
    for (i, (layout, expected)) in [
        // An HF_HOME's xet chunk cache goes beside the stagefs cache, off the NAS.
        (
            Layout::HfHome,
            "export HF_HOME={mnt} HF_XET_CACHE={cache}/xet",
        ),
        (Layout::HubCache, "export HF_HUB_CACHE={mnt}\n"),
        (Layout::PlainFolder, "load models by path under {mnt}"),
        // Issue 46: a hub cache with plain folders beside it was told only its variable.
        (
            Layout::HubCache,
            "export HF_HUB_CACHE={mnt} for its HF repositories; load its plain model folders by path under {mnt}\n",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let s = Scratch::new();
        let src = ShapedSource::generate(&s, layout, ID, 1, "64K");
        if i == 3 {
            let folder = src.root.join("local/llama");
            fs::create_dir_all(&folder).expect("mkdir");
            fs::write(folder.join("config.json"), "{}").expect("config");
            fs::write(folder.join("model.safetensors"), [7u8; 4096]).expect("weights");
        }
        let _unmount = Unmount(s.mnt.clone());
        let (ok, out, err) = run_stagefs(&[
            &"--no-config",
            &"mount",
            &src.root,
            &s.mnt,
            &"--cache-dir",
            &s.cache,
        ]);
        assert!(ok, "{err}");
        assert!(is_mounted(&s.mnt));
        let expected = expected
            .replace("{mnt}", &s.mnt.display().to_string())
            .replace("{cache}", &s.cache.display().to_string());
        assert_eq!(out.lines().count(), 1, "one line: {out}");
        assert!(
            out.starts_with("mounted ") && out.contains(&expected),
            "{expected} in {out}"
        );
    }
}

#[test]
fn huggingface_hub_resolves_offline_with_hf_home_at_the_mount() {
    let (s, src, mount) = mounted(Layout::HfHome, &[]);
    let shard = &src.shard_names()[0];
    let out = Command::new(python())
        .arg(workspace_root().join("tests/py/hf_home_check.py"))
        .args([ID, &src.model.commit, shard])
        .arg(&src.root)
        .env("HF_HOME", &s.mnt)
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env_remove("HF_HUB_CACHE")
        .env_remove("HUGGINGFACE_HUB_CACHE")
        .env_remove("HF_TOKEN")
        .env_remove("HF_TOKEN_PATH")
        .output()
        .expect("running python");
    let report = mount.client_report(&out);
    assert_eq!(
        report["token"], true,
        "the token {HF_HOME_TOKEN} came from the mount"
    );
    assert!(mount.metrics().stage_copies >= 1, "the shard was staged");
}

#[test]
fn safetensors_loads_a_plain_folder_by_path_through_the_mount() {
    let (_s, src, mount) = mounted(Layout::PlainFolder, &[]);
    let out = Command::new(python())
        .arg(workspace_root().join("tests/py/folder_check.py"))
        .arg(mount.path(&src.model_dir))
        .arg(src.root.join(&src.model_dir))
        .output()
        .expect("running python");
    let report = mount.client_report(&out);
    assert_eq!(report["shards"], SHARDS);
    let m = mount.metrics();
    assert_eq!(
        m.stage_copies, SHARDS as u64,
        "each shard staged once: {m:?}"
    );
}

#[test]
fn a_lone_gguf_file_is_staged_whole_on_open_and_named() {
    let s = Scratch::new();
    let dir = s.hub.join("gguf/Llama-3.2-1B-GGUF");
    fs::create_dir_all(&dir).expect("mkdir");
    let mut bytes = b"GGUF".to_vec();
    bytes.extend((0..(5 * MIB - 4)).map(|i| (i % 253) as u8));
    let name = "Llama-3.2-1B-Q4_K_M.gguf";
    fs::write(dir.join(name), &bytes).expect("write gguf");
    fs::write(dir.join("README.md"), "quantized").expect("readme");
    let mount = s.mount(&[]);
    let rel = Path::new("gguf/Llama-3.2-1B-GGUF").join(name);
    let file = File::open(mount.path(&rel)).expect("open the gguf");
    // The open returned: the whole file is in the cache before any read.
    let staged = staged_files_of_at_least(&s.cache, 1);
    assert_eq!(staged.len(), 1, "{staged:?}");
    assert_eq!(
        fs::metadata(&staged[0]).expect("copy").len(),
        bytes.len() as u64
    );
    drop(file);
    assert!(fs::read(mount.path(&rel)).expect("read") == bytes);
    let status = status_json(&s.cache);
    let model = model_status(&status, &rel.display().to_string());
    assert_eq!(model["kind"], "file", "{model:#}");
    assert_eq!(model["staged_bytes"], bytes.len() as u64);
}
