//! Real clients read through the mount: huggingface_hub resolving offline, and
//! safetensors' safe_open (mmap) reading every tensor.

use serde_json::Value;
use stagefs_tests::{Scratch, generate, hf_offline_check};

fn huggingface_hub_resolves_and_safetensors_reads(extra: &[&str]) {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/clients", 3, "3M");
    let mount = s.mount(extra);
    let hf_home = s.dir.path().join("hf-home");
    let out = hf_offline_check(&mount.mnt, &model, &s.hub, &hf_home)
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
