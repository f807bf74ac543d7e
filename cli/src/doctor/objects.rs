//! `stagefs doctor s3://BUCKET[/PREFIX]`: an object store as the source. It is asked
//! in this process, not the worker: its client gives up by itself after the timeout,
//! so a dead endpoint cannot hang doctor. The checks: the endpoint answers, takes the
//! credentials and holds the bucket and the prefix; the models under it; the rate of
//! one object staged the way a mount stages it (parallel ranged GETs).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use stagefs_layout::models;
use stagefs_s3::{ObjectUrl, ProbeError, S3Source};
use stagefs_source::SourceTree;
use stagefs_source::copy::{CopyJob, CopyOptions, Digests, copy_file};

use super::Check;
use super::lines::DEADLINE;
use super::model::Probe;
use super::source::{Findings, speed_check};

/// How long one request may take: doctor's own deadline for the whole source.
const REQUEST_TIMEOUT: Duration = DEADLINE;
/// Objects listed to find one to measure the rate with.
const SCANNED: usize = 1000;
/// Most bytes read to measure the rate: enough for many parts in flight.
const MEASURED_BYTES: u64 = 256 << 20;
/// Small requests timed for the latency.
const LATENCY_SAMPLES: usize = 5;

/// The findings for the object store at `url`.
pub(super) fn inspect(url: &ObjectUrl) -> Findings {
    let mut found = Findings::default();
    let source = match S3Source::new(url.clone(), REQUEST_TIMEOUT) {
        Ok(source) => source,
        Err(e) => return failed(found, &e),
    };
    let asked = Instant::now();
    let source = Arc::new(source);
    if let Err(e) = probe_within(&source, DEADLINE) {
        return failed(found, &e);
    }
    let took = asked.elapsed();
    found.checks.push(Check::ok(
        "source",
        format!(
            "{url}: the object store at {} answers, takes the credentials and holds the bucket{} ({} ms)",
            source.endpoint(),
            if url.prefix.is_empty() { "" } else { " and the prefix" },
            took.as_millis()
        ),
    ));
    let largest = source.largest_object(SCANNED);
    let tree = SourceTree::from_backend(source);
    let survey = models::survey(&tree, &[]);
    found.checks.push(super::hub::shape_check(
        Path::new(&url.to_string()),
        &survey,
        true,
    ));
    found.survey = Some(survey);
    match largest {
        Ok(Some((rel, size))) if size > 0 => found.checks.push(match measure(&tree, &rel, size) {
            Ok(probe) => speed_check(&probe, None),
            Err(e) => Check::warn("speed", format!("{}: {e}", rel.display())),
        }),
        Ok(_) => {}
        Err(e) => found.checks.push(Check::warn("speed", e.to_string())),
    }
    found
}

/// The store's first answer, within `deadline` whatever its client's retries take:
/// a store that accepts and never answers would hold doctor past its own deadline.
/// The probe left waiting ends with the process.
fn probe_within(source: &Arc<S3Source>, deadline: Duration) -> Result<(), ProbeError> {
    let (answered, answer) = std::sync::mpsc::channel();
    let asked = Arc::clone(source);
    std::thread::spawn(move || {
        let _ = answered.send(asked.probe());
    });
    answer.recv_timeout(deadline).unwrap_or_else(|_| {
        Err(ProbeError::Unreachable {
            url: source.url().to_string(),
            endpoint: source.endpoint().to_string(),
            why: format!("no answer within {} s", deadline.as_secs()),
        })
    })
}

/// The failed source check for `error`, with what to do about it.
fn failed(mut found: Findings, error: &ProbeError) -> Findings {
    let advice = match error {
        ProbeError::Credentials { .. } => {
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones) to keys that may list and read the bucket; ~/.aws profiles are not read"
        }
        ProbeError::NoBucket { .. } => {
            "check the bucket's name, and that AWS_ENDPOINT_URL names the store that holds it"
        }
        ProbeError::Unreachable { .. } => {
            "check AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3) and AWS_REGION, and that the store is up"
        }
        ProbeError::EmptyPrefix { .. } => "check the prefix: nothing is stored under it",
        ProbeError::Setup { .. } | ProbeError::Other { .. } => {
            "check AWS_ENDPOINT_URL and AWS_REGION"
        }
    };
    found
        .checks
        .push(Check::fail("source", error.to_string()).advise(advice));
    found
}

/// The latency of a HEAD of `rel` and the rate of staging its first bytes.
fn measure(tree: &SourceTree, rel: &Path, size: u64) -> std::io::Result<Probe> {
    let mut times = Vec::with_capacity(LATENCY_SAMPLES);
    for _ in 0..LATENCY_SAMPLES {
        let asked = Instant::now();
        tree.stat(rel).map_err(std::io::Error::other)?;
        times.push(asked.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    let file = tree.open(rel).map_err(std::io::Error::other)?;
    let read = AtomicU64::new(0);
    let job = CopyJob {
        size: size.min(MEASURED_BYTES),
        plan: CopyOptions::default().for_source(false),
        digests: Digests::none(),
        bytes_read: &read,
    };
    let started = Instant::now();
    let copied =
        copy_file(file.as_ref(), &mut std::io::sink(), job, |_| {}).map_err(|e| match e {
            stagefs_source::copy::CopyError::Read(e)
            | stagefs_source::copy::CopyError::Write(e) => e,
        })?;
    let seconds = started.elapsed().as_secs_f64().max(1e-9);
    Ok(Probe {
        file: rel.to_path_buf(),
        file_size: size,
        latency_ms: times[times.len() / 2],
        throughput_bytes_per_sec: copied.bytes as f64 / seconds,
        bytes_read: copied.bytes,
        seconds,
    })
}
