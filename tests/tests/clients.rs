//! Real clients read through the mount: huggingface_hub resolving offline, and
//! safetensors' safe_open (mmap) reading every tensor.

use std::process::Command;

use serde_json::Value;
use stagefs_tests::{Scratch, generate, python, workspace_root};

fn huggingface_hub_resolves_and_safetensors_reads(extra: &[&str]) {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/clients", 3, "3M");
    let mount = s.mount(extra);
    let hf_home = s.dir.path().join("hf-home");
    let out = Command::new(python())
        .arg(workspace_root().join("tests/py/hf_offline_check.py"))
        .args([&model.repo, &model.commit])
        .arg(&s.hub)
        .env("HF_HUB_CACHE", &mount.mnt)
        .env("HF_HOME", &hf_home)
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .output()
        .expect("running python");
    assert!(
        out.status.success(),
        "client check failed:\n{}\n{}\ndaemon log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        mount.log_text()
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("json report");
    assert_eq!(report["shards"], 3);
    assert_eq!(report["tensors"], 6);
    let m = mount.metrics();
    assert_eq!(m.stage_copies, 3, "each shard staged once: {m:?}");
}

#[test]
fn huggingface_hub_offline_and_safe_open_with_passthrough() {
    huggingface_hub_resolves_and_safetensors_reads(&[]);
}

#[test]
fn huggingface_hub_offline_and_safe_open_via_daemon() {
    huggingface_hub_resolves_and_safetensors_reads(&["--no-passthrough"]);
}
