//! `nfs`: what the NFS server alone can serve. One staged file is read whole over
//! loopback by `readers` NFS connections at once (so that many READs are in flight),
//! each reading every `readers`-th chunk; the baseline is the same pattern of
//! `pread`s from as many threads on the staged copy itself, in the same run. Each
//! round reads it twice over NFS: with the `nfs3_client` crate (`nfs_*`, `ratio`),
//! and with a lean client that receives each reply once into a reused buffer, as a
//! kernel client does (`lean_*`, `lean_ratio`): the second is what the server
//! alone can serve. Rounds alternate with the preads. The report gives each round's
//! times, the medians, and the median GETATTR round trip through the connection
//! front and at the library's listener behind it (what the relay costs).
//!
//! `jukebox`: what a loader waits for a cold file over NFS, end to end. The first READ
//! of a file starts its copy; a client that gets JUKEBOX sleeps as the macOS client
//! does (4 s, doubling to 30 s) or the Linux one (5 s) and asks again. The report
//! sets the time to the first byte beside the time the copy took: the difference is
//! what NFS's lack of OPEN costs on top of the copy. The source's reads of file bytes
//! are slowed by a fixed delay each (the fault-injecting source; its metadata answers
//! at once, as a NAS behind a narrow link), so the copy takes a chosen time.
//!
//! The server runs in this process over the real stack (store, stager, policy, NFS
//! adapter). Run as root: the server takes
//! only connections from reserved ports.

use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nfs3_client::nfs3_types::nfs3::{GETATTR3args, nfs_fh3, nfsstat3};
use serde_json::{Value, json};
use stagefs_nfs::client::{self, Client};
use stagefs_nfs::jukebox;
use stagefs_policy::{FsConfig, Policy};
use stagefs_source::SourceTree;
use stagefs_stage::{Stager, StagerOptions};
use stagefs_store::{Budget, Key, Store};

use crate::lean_nfs::LeanClient;

/// Serves `source` with a cache in `cache`, stages `file` through the server, then
/// times `rounds` rounds of reading it over NFS and from its copy.
pub(crate) fn run(
    source: &Path,
    cache: &Path,
    file: &Path,
    readers: usize,
    chunk: u32,
    rounds: usize,
) -> anyhow::Result<Value> {
    if readers == 0 || rounds == 0 {
        bail!("--readers and --rounds must be at least 1");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("runtime")?;
    runtime.block_on(async {
        let (served, stager) = serve(source, cache).await?;
        let addr = served.addr;
        let mut first = connect(addr).await?;
        let fh = lookup(&mut first, file).await?;
        let size = read_range(&mut first, &fh, 0, u64::MAX, 1, chunk).await?;
        let copy = stager.store().data_path(&Key::for_source_path(file));
        let mut clients = Vec::new();
        let mut lean = Vec::new();
        for _ in 0..readers {
            clients.push(connect(addr).await?);
            lean.push(LeanClient::connect(addr).await?);
        }
        // Untimed: the lean client must get exactly the copy's bytes.
        check_lean_reads(&mut lean[0], &fh, &copy, size, chunk).await?;
        let (mut nfs, mut lean_secs, mut local) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            local.push(local_round(&copy, size, readers, chunk).await?);
            let (secs, back) = nfs_round(clients, &fh, size, chunk).await?;
            clients = back;
            nfs.push(secs);
            let (secs, back) = lean_round(lean, &fh, size, chunk).await?;
            lean = back;
            lean_secs.push(secs);
        }
        let getattr_front = getattr_micros(&mut first, &fh).await?;
        let mut behind = connect(served.library_addr).await?;
        let getattr_library = getattr_micros(&mut behind, &fh).await?;
        let (nfs_median, local_median) = (median(&nfs), median(&local));
        let lean_median = median(&lean_secs);
        let mib = size as f64 / f64::from(1 << 20);
        Ok(json!({
            "bench": "nfs",
            "file": file,
            "bytes": size,
            "readers": readers,
            "chunk": chunk,
            "nfs_seconds": nfs,
            "lean_seconds": lean_secs,
            "local_seconds": local,
            "nfs_mib_per_s": mib / nfs_median,
            "lean_mib_per_s": mib / lean_median,
            "local_mib_per_s": mib / local_median,
            "ratio": local_median / nfs_median,
            "lean_ratio": local_median / lean_median,
            "getattr_us_through_front": getattr_front,
            "getattr_us_at_library": getattr_library,
        }))
    })
}

/// Reads the whole file with `client` and compares it with its copy.
async fn check_lean_reads(
    client: &mut LeanClient,
    fh: &nfs_fh3,
    copy: &Path,
    size: u64,
    chunk: u32,
) -> anyhow::Result<()> {
    let want = std::fs::read(copy).with_context(|| format!("reading {}", copy.display()))?;
    let mut offset = 0;
    while offset < size {
        let (data, _) = client.read(fh, offset, chunk).await?;
        let at = offset as usize;
        if data.is_empty() || want.get(at..at + data.len()) != Some(data) {
            bail!("the lean client got wrong bytes at {offset}");
        }
        offset += data.len() as u64;
    }
    Ok(())
}

/// Every `clients.len()`-th chunk per client, as [`nfs_round`] reads, with the lean
/// client.
async fn lean_round(
    clients: Vec<LeanClient>,
    fh: &nfs_fh3,
    size: u64,
    chunk: u32,
) -> anyhow::Result<(f64, Vec<LeanClient>)> {
    let step = clients.len() as u64 * u64::from(chunk);
    let fh = fh.clone();
    timed_round(clients, move |k, mut client| {
        let fh = fh.clone();
        async move {
            let mut offset = k as u64 * u64::from(chunk);
            while offset < size {
                client.read(&fh, offset, chunk).await?;
                offset += step;
            }
            Ok(client)
        }
    })
    .await
}

/// Runs `read(k, client)` for every client at once: how long until all are done,
/// and the clients back.
async fn timed_round<C, R, F>(clients: Vec<C>, read: R) -> anyhow::Result<(f64, Vec<C>)>
where
    C: Send + 'static,
    R: Fn(usize, C) -> F,
    F: Future<Output = anyhow::Result<C>> + Send + 'static,
{
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(k, client)| tokio::spawn(read(k, client)))
        .collect();
    let mut back = Vec::new();
    for task in tasks {
        back.push(task.await??);
    }
    Ok((started.elapsed().as_secs_f64(), back))
}

/// The median round trip of a GETATTR of `fh`, in microseconds, over 2,000 calls.
async fn getattr_micros(client: &mut Client, fh: &nfs_fh3) -> anyhow::Result<f64> {
    let args = GETATTR3args { object: fh.clone() };
    let mut micros = Vec::new();
    for _ in 0..2000 {
        let started = Instant::now();
        client.nfs3_client.getattr(&args).await?;
        micros.push(started.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median(&micros))
}

/// How a client waits after a JUKEBOX answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Backoff {
    /// Apple's client: 4 s, doubling up to 30 s.
    Macos,
    /// Linux's client: 5 s each time.
    Linux,
}

impl Backoff {
    fn delay(self, attempt: u32) -> Duration {
        let schedule = match self {
            Backoff::Macos => jukebox::Backoff::Apple,
            Backoff::Linux => jukebox::Backoff::LINUX,
        };
        schedule.delay(attempt)
    }
}

/// Times the first byte of `file` against its copy, with a source slowed by `delay`
/// per operation and a client that backs off as `backoff` says.
pub(crate) fn jukebox(
    source: &Path,
    cache: &Path,
    file: &Path,
    delay: Duration,
    backoff: Backoff,
) -> anyhow::Result<Value> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("runtime")?;
    runtime.block_on(async {
        let slow = stagefs_source::faulty::FaultySource::new(source).context("source")?;
        let tree = SourceTree::from_backend(slow.clone());
        let (served, stager) = serve_tree(tree, cache).await?;
        let addr = served.addr;
        let mut client = connect(addr).await?;
        let fh = lookup(&mut client, file).await?;
        slow.set(stagefs_source::faulty::Behaviour::SlowReads(delay));
        let started = Instant::now();
        let mut copied = None;
        let mut jukeboxes = 0u32;
        let mut longest_call = Duration::ZERO;
        loop {
            let sent = Instant::now();
            let answer = client::read(&mut client, &fh, 0, 1 << 20).await;
            longest_call = longest_call.max(sent.elapsed());
            match answer {
                Ok(_) => break,
                Err(nfsstat3::NFS3ERR_JUKEBOX) => {
                    if copied.is_none() {
                        let (stager, file) = (stager.clone(), file.to_path_buf());
                        copied = Some(tokio::spawn(async move {
                            let _ = stager.settled(&file).await;
                            Instant::now()
                        }));
                    }
                    tokio::time::sleep(backoff.delay(jukeboxes)).await;
                    jukeboxes += 1;
                }
                Err(stat) => bail!("read: {stat}"),
            }
        }
        let first_byte = started.elapsed().as_secs_f64();
        let copy = match copied {
            Some(task) => (task.await? - started).as_secs_f64(),
            None => first_byte,
        };
        Ok(json!({
            "bench": "jukebox",
            "file": file,
            "client": format!("{backoff:?}").to_lowercase(),
            "delay_ms": delay.as_millis() as u64,
            "copy_seconds": copy,
            "first_byte_seconds": first_byte,
            "extra_seconds": first_byte - copy,
            "jukeboxes": jukeboxes,
            "longest_call_seconds": longest_call.as_secs_f64(),
        }))
    })
}

/// Where a served export listens: its front, and the library behind it.
struct Served {
    addr: SocketAddr,
    library_addr: SocketAddr,
}

async fn serve(source: &Path, cache: &Path) -> anyhow::Result<(Served, Stager)> {
    serve_tree(SourceTree::new(source).context("source")?, cache).await
}

async fn serve_tree(tree: SourceTree, cache: &Path) -> anyhow::Result<(Served, Stager)> {
    let store = Store::open(cache, Budget::default()).context("opening the cache")?;
    let runtime = tokio::runtime::Handle::current();
    let stager = Stager::with_options(
        tree,
        store,
        Arc::default(),
        runtime.clone(),
        StagerOptions::default(),
    );
    let config = FsConfig {
        prefetch: false,
        redirect: false,
        ..FsConfig::default()
    };
    let journal = cache.join("nfs-inodes.jsonl");
    let policy = Policy::with_inode_journal(stager.clone(), config, runtime, &journal)?;
    let serving =
        stagefs_nfs::serve(Arc::new(policy), SocketAddr::from(([127, 0, 0, 1], 0)), 0).await?;
    let served = Served {
        addr: serving.addr,
        library_addr: serving.library_addr,
    };
    // Served until the process ends.
    std::mem::forget(serving);
    Ok((served, stager))
}

async fn connect(addr: SocketAddr) -> anyhow::Result<Client> {
    client::connect(addr, 0, "/")
        .await
        .map_err(|e| anyhow::anyhow!("mounting the export (run as root): {e}"))
}

async fn lookup(client: &mut Client, rel: &Path) -> anyhow::Result<nfs_fh3> {
    client::lookup(client, rel)
        .await
        .map_err(|stat| anyhow::anyhow!("lookup {}: {stat}", rel.display()))
}

/// Reads chunks `first`, `first + step`, ... of `fh` up to `end` (or its end of file),
/// retrying JUKEBOX; returns where the file ends.
async fn read_range(
    client: &mut Client,
    fh: &nfs_fh3,
    first: u64,
    end: u64,
    step: u64,
    chunk: u32,
) -> anyhow::Result<u64> {
    let mut index = first;
    loop {
        let offset = index * u64::from(chunk);
        if offset >= end {
            return Ok(end);
        }
        // However long the staging takes: the benchmark times it.
        let read = client::read_waiting(client, fh, offset, chunk, Duration::MAX).await;
        match read {
            Ok((data, true)) => return Ok(offset + data.len() as u64),
            Ok((_, false)) => index += step,
            Err(stat) => bail!("read: {stat}"),
        }
    }
}

async fn nfs_round(
    clients: Vec<Client>,
    fh: &nfs_fh3,
    size: u64,
    chunk: u32,
) -> anyhow::Result<(f64, Vec<Client>)> {
    let step = clients.len() as u64;
    let fh = fh.clone();
    timed_round(clients, move |k, mut client| {
        let fh = fh.clone();
        async move {
            read_range(&mut client, &fh, k as u64, size, step, chunk).await?;
            Ok(client)
        }
    })
    .await
}

async fn local_round(copy: &Path, size: u64, readers: usize, chunk: u32) -> anyhow::Result<f64> {
    let file = Arc::new(File::open(copy).with_context(|| format!("opening {}", copy.display()))?);
    let started = Instant::now();
    let threads: Vec<_> = (0..readers)
        .map(|k| {
            let file = Arc::clone(&file);
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                let mut buf = vec![0; chunk as usize];
                let mut offset = k as u64 * u64::from(chunk);
                while offset < size {
                    let _ = file.read_at(&mut buf, offset)?;
                    offset += readers as u64 * u64::from(chunk);
                }
                Ok(())
            })
        })
        .collect();
    for thread in threads {
        thread.await??;
    }
    Ok(started.elapsed().as_secs_f64())
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}
