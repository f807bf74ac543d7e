//! Real clients read through the mount: huggingface_hub resolving offline, and
//! safetensors' safe_open (mmap) reading every tensor. The mount is served by the
//! test process (the clients are child processes).

use stagefs_mount::MountSpec;
use stagefs_tests::{LibMount, Model, Scratch, generate, hf_offline_check};

/// Returns the mount first, so that dropping the tuple unmounts before the scratch
/// directory under it is removed.
fn huggingface_hub_resolves_and_safetensors_reads(
    adjust: impl FnOnce(&mut MountSpec),
) -> (LibMount, Scratch, Model) {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/clients", 3, "3M");
    let mount = s.mount_in_process(adjust);
    run_client_check(&s, &mount, &model);
    let m = mount.metrics();
    assert_eq!(m.stage_copies, 3, "each shard staged once: {m:?}");
    (mount, s, model)
}

fn run_client_check(s: &Scratch, mount: &LibMount, model: &Model) {
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
    huggingface_hub_resolves_and_safetensors_reads(|_| {});
}

#[test]
fn huggingface_hub_offline_and_safe_open_via_daemon() {
    // --no-passthrough --no-redirect
    huggingface_hub_resolves_and_safetensors_reads(|spec| {
        spec.fs.passthrough = false;
        spec.fs.redirect = false;
    });
}

/// Without passthrough, a staged shard is a link to its local copy: the second load
/// follows the links and opens no staged file through the daemon.
#[test]
fn huggingface_hub_offline_and_safe_open_via_links_to_local_copies() {
    // --no-passthrough --read-only: a writable mount served by root presents no links
    // (root's writes would ignore the copies' 0400 and land in them).
    let (mount, s, model) = huggingface_hub_resolves_and_safetensors_reads(|spec| {
        spec.fs.passthrough = false;
        spec.fs.read_only = true;
    });
    // Past the kernel's 1 s entry timeout, lookups see the shards as staged.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let before = mount.metrics();
    run_client_check(&s, &mount, &model);
    let after = mount.metrics();
    assert!(after.redirects > before.redirects, "{after:?}");
    assert_eq!(after.daemon_opens, before.daemon_opens, "{after:?}");
    assert_eq!(after.stage_copies, 3, "nothing staged again: {after:?}");
}
