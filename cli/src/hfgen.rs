//! Generates a synthetic HuggingFace cache: one sharded safetensors model in the real
//! `models--org--name/{blobs,refs,snapshots}` layout, with LFS blobs named by sha256,
//! small files by git blob sha1, and relative snapshot symlinks. Used by the demo,
//! the integration tests and the benchmarks, so none of them needs the network.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde_json::json;
use sha1::Sha1;
use sha2::{Digest, Sha256};

const HIDDEN: u64 = 256;
const F32: u64 = 4;

/// One file of the generated snapshot.
#[derive(Debug, Clone)]
pub(crate) struct SnapshotFile {
    /// Name inside the snapshot directory.
    pub(crate) name: String,
    /// Size in bytes.
    pub(crate) size: u64,
}

/// What [`generate`] wrote.
#[derive(Debug, Clone)]
pub(crate) struct DemoModel {
    /// `<hub>/models--org--name`.
    pub(crate) repo_dir: PathBuf,
    /// The commit `refs/main` points at.
    pub(crate) commit: String,
    /// The snapshot's files, weight shards last.
    pub(crate) files: Vec<SnapshotFile>,
}

impl DemoModel {
    /// The snapshot directory, relative to the hub directory.
    pub(crate) fn snapshot_rel(&self) -> PathBuf {
        let repo = self
            .repo_dir
            .file_name()
            .map(PathBuf::from)
            .unwrap_or_default();
        repo.join("snapshots").join(&self.commit)
    }
}

/// Writes repository `repo` ("org/name") with `shards` weight files of about
/// `shard_size` bytes each into hub directory `hub`.
pub(crate) fn generate(
    hub: &Path,
    repo: &str,
    shards: usize,
    shard_size: u64,
) -> anyhow::Result<DemoModel> {
    let Some((org, name)) = repo.split_once('/') else {
        bail!("repository id '{repo}' must look like org/name");
    };
    if shards == 0 {
        bail!("a model needs at least one shard");
    }
    let repo_dir = hub.join(format!("models--{org}--{name}"));
    let mut files: Vec<(String, Vec<u8>, bool)> = Vec::new();
    let mut weight_map = serde_json::Map::new();
    let mut total = 0u64;
    for i in 0..shards {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, shards);
        let (bytes, tensors) = shard(i, shard_size);
        total += bytes.len() as u64;
        for tensor in tensors {
            weight_map.insert(tensor, json!(file));
        }
        files.push((file, bytes, true));
    }
    let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    let config =
        json!({"model_type": "stagefs-demo", "hidden_size": HIDDEN, "num_hidden_layers": shards});
    files.insert(
        0,
        (
            "model.safetensors.index.json".into(),
            pretty(&index)?,
            false,
        ),
    );
    files.insert(0, ("config.json".into(), pretty(&config)?, false));
    write_repo(&repo_dir, files)
}

fn pretty(value: &serde_json::Value) -> anyhow::Result<Vec<u8>> {
    Ok(serde_json::to_vec_pretty(value)?)
}

fn write_repo(repo_dir: &Path, files: Vec<(String, Vec<u8>, bool)>) -> anyhow::Result<DemoModel> {
    let blobs = repo_dir.join("blobs");
    fs::create_dir_all(&blobs).with_context(|| format!("creating {}", blobs.display()))?;
    let hashed: Vec<(String, String, Vec<u8>)> = files
        .into_iter()
        .map(|(name, bytes, lfs)| {
            let hash = if lfs {
                sha256_hex(&bytes)
            } else {
                git_blob_sha1(&bytes)
            };
            (name, hash, bytes)
        })
        .collect();
    let commit = format!(
        "{:x}",
        Sha1::digest(
            hashed
                .iter()
                .map(|(_, h, _)| h.as_str())
                .collect::<String>(),
        )
    );
    let snapshot = repo_dir.join("snapshots").join(&commit);
    fs::create_dir_all(&snapshot)?;
    fs::create_dir_all(repo_dir.join("refs"))?;
    fs::write(repo_dir.join("refs/main"), &commit)?;
    let mut out = Vec::new();
    for (name, hash, bytes) in hashed {
        fs::write(blobs.join(&hash), &bytes)?;
        let link = snapshot.join(&name);
        let _ = fs::remove_file(&link);
        symlink(format!("../../blobs/{hash}"), &link)?;
        out.push(SnapshotFile {
            name,
            size: bytes.len() as u64,
        });
    }
    Ok(DemoModel {
        repo_dir: repo_dir.to_path_buf(),
        commit,
        files: out,
    })
}

/// A safetensors file with two F32 tensors of layer `layer`, about `size` bytes long.
fn shard(layer: usize, size: u64) -> (Vec<u8>, Vec<String>) {
    let rows = (size.saturating_sub(4096) / (HIDDEN * F32)).max(1);
    let weight = format!("model.layers.{layer}.mlp.weight");
    let norm = format!("model.layers.{layer}.norm.weight");
    let weight_bytes = rows * HIDDEN * F32;
    let header = json!({
        "__metadata__": {"format": "pt"},
        weight.clone(): {"dtype": "F32", "shape": [rows, HIDDEN], "data_offsets": [0, weight_bytes]},
        norm.clone(): {"dtype": "F32", "shape": [HIDDEN], "data_offsets": [weight_bytes, weight_bytes + HIDDEN * F32]},
    });
    let mut header = header.to_string().into_bytes();
    // The data section must start 8-byte aligned; safetensors pads the header with spaces.
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let values = (rows + 1) * HIDDEN;
    let mut bytes = Vec::with_capacity(8 + header.len() + (values * F32) as usize);
    bytes.extend_from_slice(&(header.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&header);
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (layer as u64 + 1);
    for _ in 0..values {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        // Finite values in [-1, 1): NaNs would make equality checks meaningless.
        let value = (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        bytes.extend_from_slice(&value.to_le_bytes());
    }
    (bytes, vec![weight, norm])
}

fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// The id git (and so the Hub) gives a non-LFS file.
fn git_blob_sha1(bytes: &[u8]) -> String {
    let mut hasher = Sha1::new();
    hasher.update(format!("blob {}\0", bytes.len()));
    hasher.update(bytes);
    format!("{:x}", hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_hub_cache() -> anyhow::Result<()> {
        let hub = tempfile::tempdir()?;
        let model = generate(hub.path(), "acme/tiny", 2, 64 << 10)?;
        let refs = fs::read_to_string(model.repo_dir.join("refs/main"))?;
        assert_eq!(refs, model.commit);
        let snapshot = hub.path().join(model.snapshot_rel());
        for file in &model.files {
            let link = fs::read_link(snapshot.join(&file.name))?;
            assert!(link.starts_with("../../blobs/"), "{}", link.display());
            let bytes = fs::read(snapshot.join(&file.name))?;
            assert_eq!(bytes.len() as u64, file.size);
            let blob = link
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            if file.name.ends_with(".safetensors") {
                assert_eq!(blob, sha256_hex(&bytes));
            } else {
                assert_eq!(blob, git_blob_sha1(&bytes));
            }
        }
        // git's well-known id of the empty blob.
        assert_eq!(
            git_blob_sha1(b""),
            "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
        );
        Ok(())
    }
}
