//! Copies written through the mount (the policy's tee) become staged copies here, as
//! flights of their own. So an open or a prefetch of the file while its written copy
//! is being verified joins that verification, rather than copying the file back over
//! the link; if the written copy is refused, it copies from the source as usual
//! ([`Stager::join`]). A loader that downloads a model and opens it at once (an
//! online `mlx_lm.load`) reads the copy it wrote.

use std::collections::HashMap;
use std::path::Path;

use tempfile::NamedTempFile;
use tracing::{debug, info};

use super::{Flight, Inner, Progress, Purpose, StageResult, Stager, reusable, staged};
use crate::error::StageError;
use stagefs_source::SourceError;
use stagefs_source::copy::{Digests, digest_file};
use stagefs_source::{SourceMeta, Stamp};
use stagefs_store::StoreError;
use stagefs_store::index::{CopyId, Entry};
use stagefs_store::key::Key;

/// A whole copy of a file written through the mount: a temp file of the store
/// holding the `len` bytes written, front to back.
#[derive(Debug)]
pub struct WrittenCopy {
    /// The copy.
    pub tmp: NamedTempFile,
    /// How many bytes were written.
    pub len: u64,
}

/// What the source holds now of a written file, asked on the source pool.
pub type SourceVersion = Box<dyn FnOnce() -> Result<SourceMeta, SourceError> + Send>;

impl Stager {
    /// Makes `copy` the staged copy of `rel` in the background, if it proves right:
    /// the source (`version`) holds a file of exactly `copy.len` bytes; a blob named
    /// by its sha256 hashes to its name (any other file is hashed with blake3, as a
    /// staged copy is); and it fits the budget without evicting anything, as a
    /// prefetch must. `committed` runs once the copy is in the index, before anyone
    /// waiting for it is answered.
    ///
    /// The flight is entered before this returns, so an open that follows waits for
    /// it. If a copy of `rel` is already in flight, `copy` is dropped: that one will do.
    pub fn adopt_written(
        &self,
        rel: &Path,
        copy: WrittenCopy,
        version: SourceVersion,
        committed: impl FnOnce() + Send + 'static,
    ) {
        self.enter_written(rel, |_| {
            move |inner: &Inner, rel: &Path, key: &Key, progress: &Progress| {
                inner
                    .adopt_now(rel, key, copy, version, progress, committed)
                    .inspect_err(|why| debug!(%why, "a written copy was not staged"))
            }
        });
    }

    /// `from`, whose copy was written through the mount (stored, or in flight as
    /// [`Stager::adopt_written`] made it), was renamed to `to` on the source: that
    /// copy becomes `to`'s, checked as [`Stager::adopt_written`] checks a copy
    /// against `version` (what the source holds at `to` now). As there, the flight
    /// for `to` is entered before this returns; it waits for `from`'s own flight,
    /// then takes its copy out of the store.
    pub fn adopt_renamed(
        &self,
        from: &Path,
        to: &Path,
        version: SourceVersion,
        committed: impl FnOnce() + Send + 'static,
    ) {
        let (from, runtime) = (from.to_path_buf(), self.inner.runtime.clone());
        self.enter_written(to, |inflight| {
            let from_key = Key::for_source_path(&from);
            let earlier = inflight.get(&from_key).map(|f| f.result.clone());
            move |inner: &Inner, rel: &Path, key: &Key, progress: &Progress| {
                if let Some(earlier) = earlier {
                    // On a worker thread, outside the runtime: it may wait here.
                    let _ = runtime.block_on(earlier);
                }
                let taken = inner.store.take(&from_key, |e| e.source == from)?;
                let Some(tmp) = taken else {
                    return Err(StageError::NoWrittenCopy {
                        path: rel.to_path_buf(),
                    });
                };
                let len = tmp
                    .as_file()
                    .metadata()
                    .map_err(|e| StoreError::io(tmp.path(), e))?
                    .len();
                let copy = WrittenCopy { tmp, len };
                inner
                    .adopt_now(rel, key, copy, version, progress, committed)
                    .inspect_err(|why| debug!(%why, "a renamed written copy was not staged"))
            }
        });
    }

    /// Enters a flight for written copy `rel` that runs the work `make` returns
    /// (`make` sees the flights in progress), unless a copy of `rel` is in flight.
    fn enter_written<W>(&self, rel: &Path, make: impl FnOnce(&HashMap<Key, Flight>) -> W)
    where
        W: FnOnce(&Inner, &Path, &Key, &Progress) -> StageResult + Send + 'static,
    {
        let key = Key::for_source_path(rel);
        let mut inflight = self.inner.flights();
        if inflight.contains_key(&key) {
            return;
        }
        let work = make(&inflight);
        let flight = self.start_flight(rel.to_path_buf(), key.clone(), Purpose::Written, work);
        inflight.insert(key, flight);
    }

    /// Waits until a copy of `rel` written through the mount is settled, if one is
    /// being verified: committed (then the store has it) or refused.
    pub async fn written_settled(&self, rel: &Path) {
        let flight = self
            .flight_of(rel)
            .filter(|f| f.purpose == Purpose::Written);
        if let Some(flight) = flight {
            let _ = flight.result.await;
        }
    }
}

impl Inner {
    fn adopt_now(
        &self,
        rel: &Path,
        key: &Key,
        copy: WrittenCopy,
        version: SourceVersion,
        progress: &Progress,
        committed: impl FnOnce(),
    ) -> StageResult {
        let changed = || StageError::SourceChanged {
            path: rel.to_path_buf(),
        };
        let meta = self.meta_on_pool(rel, version)?;
        if !meta.is_file() || meta.size != copy.len {
            return Err(changed());
        }
        let stamp = Stamp::of(&meta);
        progress
            .total
            .store(stamp.size, std::sync::atomic::Ordering::Relaxed);
        let named = key.content_sha256().map(str::to_owned);
        if named.is_some()
            && let Some(hit) = self.store.lookup(key, |e| reusable(e, key, rel, stamp))
        {
            // The same blob is already stored: it is these bytes.
            return Ok(staged(hit, stamp, false));
        }
        let tmp_path = copy.tmp.path().to_path_buf();
        let digest = digest_file(&tmp_path, Digests::for_copy(named.is_some()))
            .map_err(|e| StoreError::io(&tmp_path, e))?;
        if digest.bytes != stamp.size {
            return Err(changed());
        }
        if named.is_some() && digest.sha256 != named {
            return Err(StageError::ContentMismatch {
                path: rel.to_path_buf(),
            });
        }
        let reservation = self.store.reserve(key, stamp.size, rel, false)?;
        let entry = Entry {
            source: rel.to_path_buf(),
            stamp,
            blake3: digest.blake3,
            last_use: stagefs_source::sys::now_secs(),
            copy: CopyId::default(),
        };
        let hit = self.store.commit(key, copy.tmp, entry, reservation)?;
        committed();
        info!(path = %stagefs_source::logged(rel), bytes = stamp.size, "staged as written");
        Ok(staged(hit, stamp, false))
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::io::Write;
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use sha2::{Digest, Sha256};

    use super::super::tests::{Fixture, contents, fixture};
    use super::*;

    /// A blob on the source, as a download through the mount leaves it: its path.
    fn blob_on_source(fx: &Fixture, data: &[u8]) -> PathBuf {
        let sha = format!("{:x}", Sha256::digest(data));
        let rel = PathBuf::from(format!("models--a--b/blobs/{sha}"));
        fs::create_dir_all(fx.src.path().join("models--a--b/blobs")).expect("mkdir");
        fs::write(fx.src.path().join(&rel), data).expect("write");
        rel
    }

    /// Adopts `written` as the copy of `rel`; whether its `committed` ran.
    fn adopt(fx: &Fixture, rel: &Path, written: &[u8]) -> Arc<AtomicBool> {
        let mut tmp = fx.stager.store().create_temp().expect("temp");
        tmp.write_all(written).expect("write the copy");
        let copy = WrittenCopy {
            tmp,
            len: written.len() as u64,
        };
        let (source, path) = (fx.stager.source().clone(), rel.to_path_buf());
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        fx.stager
            .adopt_written(rel, copy, Box::new(move || source.stat(&path)), move || {
                flag.store(true, Ordering::SeqCst)
            });
        done
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_open_during_the_verification_of_a_written_copy_gets_that_copy() {
        let fx = fixture();
        let data: Vec<u8> = (0..6_000_000u32).map(|i| (i * 7 % 253) as u8).collect();
        let rel = blob_on_source(&fx, &data);
        let committed = adopt(&fx, &rel, &data);
        // Entered before adopt_written returned: this open joins it.
        let staged = fx.stager.stage(&rel).await.expect("stage");
        assert!(!staged.copied);
        assert!(contents(&staged) == data);
        assert!(
            committed.load(Ordering::SeqCst),
            "committed before answering"
        );
        let m = fx.stager.metrics().snapshot();
        assert_eq!((m.stage_copies, m.bytes_copied), (0, 0), "{m:?}");
        assert!(fx.stager.in_flight().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_written_copy_that_does_not_match_its_blobs_name_is_staged_from_the_source() {
        let fx = fixture();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 249) as u8).collect();
        let rel = blob_on_source(&fx, &data);
        let mut garbled = data.clone();
        garbled[1_234_567] ^= 1;
        let committed = adopt(&fx, &rel, &garbled);
        let staged = fx.stager.stage(&rel).await.expect("stage");
        assert!(staged.copied, "copied from the source instead");
        assert!(contents(&staged) == data);
        assert!(!committed.load(Ordering::SeqCst));
        assert_eq!(fx.stager.metrics().snapshot().stage_copies, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_written_copy_follows_a_rename_even_while_it_is_still_verified() {
        let fx = fixture();
        let data: Vec<u8> = (0..5_000_000u32).map(|i| (i * 3 % 241) as u8).collect();
        let (tmp, done) = (PathBuf::from("m/w.bin.tmp"), PathBuf::from("m/w.bin"));
        fs::create_dir_all(fx.src.path().join("m")).expect("mkdir");
        fs::write(fx.src.path().join(&tmp), &data).expect("write");
        // As the tee asks it: of the written handle, which a rename does not change.
        let meta = fx.stager.source().stat(&tmp).expect("stat");
        let mut copy = fx.stager.store().create_temp().expect("temp");
        copy.write_all(&data).expect("write the copy");
        let len = data.len() as u64;
        let copy = WrittenCopy { tmp: copy, len };
        fx.stager
            .adopt_written(&tmp, copy, Box::new(move || Ok(meta)), || {});
        fs::rename(fx.src.path().join(&tmp), fx.src.path().join(&done)).expect("rename");
        let (source, path) = (fx.stager.source().clone(), done.clone());
        let committed = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&committed);
        fx.stager.adopt_renamed(
            &tmp,
            &done,
            Box::new(move || source.stat(&path)),
            move || flag.store(true, Ordering::SeqCst),
        );
        let staged = fx.stager.stage(&done).await.expect("stage");
        assert!(!staged.copied && contents(&staged) == data);
        assert!(committed.load(Ordering::SeqCst));
        assert_eq!(fx.stager.metrics().snapshot().stage_copies, 0);
        let store = fx.stager.store();
        assert!(!store.contains(&stagefs_store::key::Key::for_source_path(&tmp)));
        assert_eq!(store.entries().len(), 1, "one copy, under the new name");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rename_without_a_written_copy_is_staged_from_the_source() {
        let fx = fixture();
        let data = vec![9u8; 2_000_000];
        fs::write(fx.src.path().join("b.bin"), &data).expect("write");
        let (source, path) = (fx.stager.source().clone(), PathBuf::from("b.bin"));
        fx.stager.adopt_renamed(
            Path::new("a.bin"),
            Path::new("b.bin"),
            Box::new(move || source.stat(&path)),
            || {},
        );
        let staged = fx.stager.stage(Path::new("b.bin")).await.expect("stage");
        assert!(staged.copied && contents(&staged) == data);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_written_copy_of_another_length_than_the_source_is_refused() {
        let fx = fixture();
        let data = vec![5u8; 2_000_000];
        let rel = PathBuf::from("plain/model.bin");
        fs::create_dir_all(fx.src.path().join("plain")).expect("mkdir");
        fs::write(fx.src.path().join(&rel), &data).expect("write");
        let committed = adopt(&fx, &rel, &data[..1_000_000]);
        fx.stager.written_settled(&rel).await;
        assert!(!committed.load(Ordering::SeqCst));
        let staged = fx.stager.stage(&rel).await.expect("stage");
        assert!(staged.copied && contents(&staged) == data);
    }
}
