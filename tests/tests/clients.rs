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

/// Without passthrough, root's read-only mount presents staged shards as the files
/// themselves, read through the daemon, as its writable one does: a link would
/// lead an open for writing past the read-only mount into the copy, and root's
/// writes ignore the copy's 0400 (the write went through, the copy was damaged and
/// a reader's mapping died with SIGBUS). A write fails with EROFS, and the copy
/// and the source keep their bytes.
#[test]
fn a_read_only_mount_served_by_root_presents_no_links_and_refuses_writes_to_shards() {
    let (mount, s, model) = huggingface_hub_resolves_and_safetensors_reads(|spec| {
        spec.fs.passthrough = false;
        spec.fs.read_only = true;
    });
    // Past the kernel's 1 s entry timeout, lookups see the shards as staged.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let shards: Vec<_> = model
        .files
        .iter()
        .filter(|f| f.name.ends_with(".safetensors"))
        .map(|f| model.snapshot_rel.join(&f.name))
        .collect();
    assert_eq!(shards.len(), 3);
    for shard in &shards {
        let resolved = std::fs::canonicalize(mount.path(shard)).expect("resolve");
        assert!(
            resolved.starts_with(&mount.mnt),
            "{} leads out of the mount, to {}",
            shard.display(),
            resolved.display()
        );
        let wrote = std::fs::OpenOptions::new()
            .write(true)
            .open(mount.path(shard))
            .map(drop);
        let errno = wrote
            .expect_err("a write through a read-only mount")
            .raw_os_error();
        assert_eq!(errno, Some(libc::EROFS), "{}", shard.display());
    }
    let before = mount.metrics();
    run_client_check(&s, &mount, &model);
    let after = mount.metrics();
    assert_eq!(after.redirects, before.redirects, "{after:?}");
    assert_eq!(after.stage_copies, 3, "nothing staged again: {after:?}");
}
