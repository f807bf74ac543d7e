//! Real clients read through the mount: huggingface_hub resolving offline, and
//! safetensors' safe_open (mmap) reading every tensor.

use stagefs_tests::{Model, Mount, Scratch, generate, hf_offline_check};

/// Returns the mount first, so that dropping the tuple unmounts before the scratch
/// directory under it is removed.
fn huggingface_hub_resolves_and_safetensors_reads(extra: &[&str]) -> (Mount, Scratch, Model) {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/clients", 3, "3M");
    let mount = s.mount(extra);
    run_client_check(&s, &mount, &model);
    let m = mount.metrics();
    assert_eq!(m.stage_copies, 3, "each shard staged once: {m:?}");
    (mount, s, model)
}

fn run_client_check(s: &Scratch, mount: &Mount, model: &Model) {
    let hf_home = s.dir.path().join("hf-home");
    let out = hf_offline_check(&mount.mnt, model, &s.hub, &hf_home)
        .env("STAGEFS_CACHE_DIR", &mount.cache)
        .output()
        .expect("running python");
    let report = mount.client_report(&out);
    assert_eq!(report["shards"], 3);
    assert_eq!(report["tensors"], 6);
}

#[test]
fn huggingface_hub_offline_and_safe_open_with_passthrough() {
    huggingface_hub_resolves_and_safetensors_reads(&[]);
}

#[test]
fn huggingface_hub_offline_and_safe_open_via_daemon() {
    huggingface_hub_resolves_and_safetensors_reads(&["--no-passthrough", "--no-redirect"]);
}

/// Without passthrough, a staged shard is a link to its local copy: the second load
/// follows the links and opens no staged file through the daemon.
#[test]
fn huggingface_hub_offline_and_safe_open_via_links_to_local_copies() {
    let (mount, s, model) = huggingface_hub_resolves_and_safetensors_reads(&["--no-passthrough"]);
    // Past the kernel's 1 s entry timeout, lookups see the shards as staged.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let before = mount.metrics();
    run_client_check(&s, &mount, &model);
    let after = mount.metrics();
    assert!(after.redirects > before.redirects, "{after:?}");
    assert_eq!(after.daemon_opens, before.daemon_opens, "{after:?}");
    assert_eq!(after.stage_copies, 3, "nothing staged again: {after:?}");
}
