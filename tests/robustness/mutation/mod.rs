//! Mutation test of every reader of bytes trajstore did not write itself, and of the dataset files
//! it did: small valid inputs of each ingest format (Parquet, Arrow IPC file and stream, `.npz`
//! stored and deflated, a directory of `.npy` files, directories of `.npz` shards (OGBench's and
//! one episode per file), a TorchRL dump, D4RL and Minari HDF5, a DQN
//! Replay directory's gzipped `.npy` files, an RLDS directory's TFRecord shard, `features.json`
//! and `dataset_info.json`) and a dataset's segment, episode table and manifest,
//! and a frame dataset's dictionary, segment and episode table, get byte flips, truncations and
//! edits of their length and offset fields (seeded, so every run tries the same few hundred
//! cases; the pristine files are built by `targets.rs`). For each mutated input the library
//! (`ingest`, or `Dataset::open` + snapshot + every frame decoded + gather + verify) runs under
//! `catch_unwind` in a thread with a deadline, and for every few cases the CLI binary (`ingest`,
//! `verify`, `info`) runs with a timeout. Accepting a mutation as valid data is fine (a flipped
//! float is still a float; a dataset file's damage always shows in `verify`'s checksums); a
//! panic, an abort, a hang, or an error that does not name the file (or the dataset directory)
//! is a failure.
//!
//! The whole file runs in well under a minute in a debug build on two cores.

mod targets;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::{copy_tree, small_segments};
use targets::targets;
use trajstore::ingest::{
    DqnOptions, IngestOptions, InputFormat, RldsOptions, ingest, ingest_dqn, ingest_rlds,
};
use trajstore::{
    BoundaryPolicy, Dataset, Error, FrameStack, Gatherer, Sampler, SamplerSpec, SliceSampler,
    Snapshot,
};

/// Seed of every random choice.
const SEED: u64 = 0x7a1e_5eed_0019;

/// How long one library run or one CLI process may take before it counts as a hang.
const DEADLINE: Duration = Duration::from_secs(30);

/// Every how many cases the CLI runs too.
const CLI_EVERY: usize = 6;

/// SplitMix64: small, seeded, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

/// One change to a file's bytes.
#[derive(Debug, Clone)]
enum Mutation {
    /// `bytes[at] ^= xor`.
    Flip { at: usize, xor: u8 },
    /// `bytes[at] = value`.
    Set { at: usize, value: u8 },
    /// Keep only the first `len` bytes.
    Truncate { len: usize },
    /// A little-endian integer of `width` bytes at `at` (a length or offset field) set to `value`.
    Int { at: usize, width: usize, value: u64 },
    /// The first `from` replaced by `to` (a number in a JSON document or a `.npy` header).
    Text { from: String, to: String },
}

impl Mutation {
    fn apply(&self, bytes: &[u8]) -> Vec<u8> {
        let mut b = bytes.to_vec();
        match self {
            Mutation::Flip { at, xor } => b[*at] ^= xor,
            Mutation::Set { at, value } => b[*at] = *value,
            Mutation::Truncate { len } => b.truncate(*len),
            Mutation::Int { at, width, value } => {
                b[*at..*at + *width].copy_from_slice(&value.to_le_bytes()[..*width]);
            }
            Mutation::Text { from, to } => {
                if let Some(at) = find_all(bytes, from.as_bytes()).first() {
                    b.splice(*at..*at + from.len(), to.bytes());
                }
            }
        }
        b
    }
}

/// What a target is read as.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// An ingest input of this format.
    Ingest(InputFormat, &'static str),
    /// A DQN Replay directory (`ingest_dqn`, `trajstore ingest --format dqn`).
    Dqn,
    /// An RLDS / TFDS directory (`ingest_rlds`, `trajstore ingest --format rlds`).
    Rlds,
    /// A file of a trajstore dataset.
    Dataset,
}

/// A file to mutate: `file` inside `root` (the input or the dataset directory; the same path
/// for a one-file input).
struct Target {
    name: &'static str,
    root: PathBuf,
    file: PathBuf,
    kind: Kind,
    /// Where length and offset fields lie, `(offset, width)`, for [`Mutation::Int`].
    fields: Vec<(usize, usize)>,
    /// Byte ranges holding the file's structure (headers, footers), where flips land half the time.
    structure: Vec<std::ops::Range<usize>>,
    /// Texts that [`Mutation::Text`] may replace (numbers of JSON documents, `.npy` shapes).
    texts: Vec<String>,
    /// Positions of base64 text (Parquet's `ARROW:schema`), where a character is replaced by
    /// another base64 character.
    base64: std::ops::Range<usize>,
    /// The file is gzipped and the mutations apply to its content (the `.npy` inside a DQN
    /// Replay file), which is gzipped again: damage a gzip check cannot see.
    gzip_inner: bool,
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![];
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(vec![], flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn find_all(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    hay.windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect()
}

/// Length fields of Arrow IPC messages (after each continuation marker) and of the file footer.
fn ipc_fields(bytes: &[u8], file: bool) -> Vec<(usize, usize)> {
    let mut f: Vec<(usize, usize)> = find_all(bytes, &[0xff; 4])
        .into_iter()
        .filter(|&i| i + 8 <= bytes.len())
        .map(|i| (i + 4, 4))
        .collect();
    if file && bytes.len() >= 10 {
        f.push((bytes.len() - 10, 4));
    }
    f
}

/// Length, count and offset fields of a zip archive (local and central headers, end record)
/// and of the `.npy` headers inside it.
fn zip_fields(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut f = vec![];
    for i in find_all(bytes, b"PK\x03\x04") {
        f.extend([(i + 18, 4), (i + 22, 4), (i + 26, 2), (i + 28, 2)]);
    }
    for i in find_all(bytes, b"PK\x01\x02") {
        f.extend([
            (i + 20, 4),
            (i + 24, 4),
            (i + 28, 2),
            (i + 30, 2),
            (i + 42, 4),
        ]);
    }
    for i in find_all(bytes, b"PK\x05\x06") {
        f.extend([(i + 8, 2), (i + 10, 2), (i + 12, 4), (i + 16, 4)]);
    }
    for i in find_all(bytes, b"\x93NUMPY") {
        f.push((i + 8, 2));
    }
    f.retain(|&(at, w)| at + w <= bytes.len());
    f
}

/// The numbers of a JSON document or `.npy` header, as texts to replace.
fn numbers(bytes: &[u8], limit: usize) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    let mut out = vec![];
    let mut cur = String::new();
    for c in text.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_digit() {
            cur.push(c);
        } else if !cur.is_empty() {
            let t = std::mem::take(&mut cur);
            if !out.contains(&t) {
                out.push(t);
            }
        }
        if out.len() >= limit {
            break;
        }
    }
    out
}

impl Target {
    fn new(name: &'static str, root: PathBuf, file: PathBuf, kind: Kind) -> Self {
        Self::build(name, root, file, kind, false)
    }

    /// A gzipped file whose content is mutated (see [`Target::gzip_inner`]).
    fn gzip_inner(name: &'static str, root: PathBuf, file: PathBuf, kind: Kind) -> Self {
        Self::build(name, root, file, kind, true)
    }

    fn build(name: &'static str, root: PathBuf, file: PathBuf, kind: Kind, inner: bool) -> Self {
        let raw = std::fs::read(&file).unwrap();
        let bytes = if inner { gunzip(&raw) } else { raw };
        let n = bytes.len();
        let name_of = file.file_name().unwrap().to_string_lossy().to_string();
        let ext = if inner {
            "npy"
        } else {
            name_of.rsplit('.').next().unwrap_or("")
        };
        let head_tail = vec![0..n.min(1024), n.saturating_sub(1024)..n];
        let mut t = Target {
            name,
            root,
            file: file.clone(),
            kind,
            fields: vec![],
            structure: head_tail,
            texts: vec![],
            base64: 0..0,
            gzip_inner: inner,
        };
        match ext {
            "parquet" => {
                t.fields.push((n - 8, 4));
                if let Some(i) = find_all(&bytes, b"ARROW:schema").first() {
                    // The value follows its thrift length: the first run of base64 text.
                    let is_b64 = |c: u8| c.is_ascii_alphanumeric() || c == b'+' || c == b'/';
                    let start = (i + 12..n).find(|&k| is_b64(bytes[k])).unwrap();
                    let end = (start..n).find(|&k| !is_b64(bytes[k])).unwrap_or(n);
                    t.base64 = start..end;
                }
            }
            "arrow" => t.fields = ipc_fields(&bytes, true),
            "arrows" => t.fields = ipc_fields(&bytes, false),
            "npz" => t.fields = zip_fields(&bytes),
            "npy" => {
                t.fields = vec![(8, 2)];
                t.texts = numbers(&bytes[..n.min(128)], 8);
            }
            "json" => t.texts = numbers(&bytes, 40),
            // gzip's header, then its trailer: CRC-32 and size of the content.
            "gz" => {
                t.fields = vec![(n - 8, 4), (n - 4, 4)];
                t.structure = vec![0..n.min(10), n.saturating_sub(8)..n];
            }
            "hdf5" => {
                // Superblock and object headers: 8-byte addresses and lengths.
                t.fields = (0..n.min(2048) / 8).map(|k| (k * 8, 8)).collect();
                t.structure = std::iter::once(0..n.min(4096)).collect();
            }
            _ => {}
        }
        t
    }

    /// The bytes mutations apply to: the file's, or its gzipped content's.
    fn content(&self) -> Vec<u8> {
        let raw = std::fs::read(&self.file).unwrap();
        if self.gzip_inner { gunzip(&raw) } else { raw }
    }

    /// The file's bytes for mutated content.
    fn encode(&self, content: Vec<u8>) -> Vec<u8> {
        if self.gzip_inner {
            gzip(&content)
        } else {
            content
        }
    }

    /// `count` seeded mutations of this target's file.
    fn mutations(&self, rng: &mut Rng, count: usize) -> Vec<Mutation> {
        let bytes = self.content();
        let n = bytes.len();
        let extremes = |orig: u64, width: usize| {
            let max = if width >= 8 {
                u64::MAX
            } else {
                (1u64 << (8 * width)) - 1
            };
            [
                0,
                1,
                orig.wrapping_sub(1) & max,
                orig.wrapping_add(1) & max,
                orig.wrapping_mul(256) & max,
                max,
                max >> 1,
                (max >> 1) + 1,
            ]
        };
        let mut out = vec![];
        while out.len() < count {
            let m = match rng.below(10) {
                0..=3 => {
                    let at = if rng.below(2) == 0 && !self.structure.is_empty() {
                        let r = &self.structure[rng.below(self.structure.len())];
                        r.start + rng.below(r.len().max(1))
                    } else {
                        rng.below(n)
                    };
                    Mutation::Flip {
                        at: at.min(n - 1),
                        xor: 1 << rng.below(8) | rng.pick(&[0u8, 0x80, 0x5a]),
                    }
                }
                4 => Mutation::Truncate { len: rng.below(n) },
                5 | 6 if !self.fields.is_empty() => {
                    let (at, width) = self.fields[rng.below(self.fields.len())];
                    let mut v = [0u8; 8];
                    v[..width].copy_from_slice(&bytes[at..at + width]);
                    let orig = u64::from_le_bytes(v);
                    Mutation::Int {
                        at,
                        width,
                        value: rng.pick(&extremes(orig, width)),
                    }
                }
                7 | 8 if !self.texts.is_empty() => {
                    let from = self.texts[rng.below(self.texts.len())].clone();
                    let to = rng
                        .pick(&[
                            "0",
                            "1",
                            "999999",
                            "4294967296",
                            "18446744073709551615",
                            "99999999999999999999999",
                            "-1",
                        ])
                        .to_string();
                    Mutation::Text { from, to }
                }
                9 if !self.base64.is_empty() => {
                    const B64: &[u8] =
                        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
                    Mutation::Set {
                        at: self.base64.start + rng.below(self.base64.len()),
                        value: B64[rng.below(64)],
                    }
                }
                _ => continue,
            };
            out.push(m);
        }
        out
    }
}

/// What one case of the library did.
enum Outcome {
    Accepted,
    Refused(String),
    Panicked(String),
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "<non-string panic>".into())
}

/// An error with its causes, as a user reads it.
fn chain(e: &trajstore::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Decodes every frame (rows and final frames) of every frame column of `snap`, before any
/// checksum is checked, as a loader reads them: damaged frames reach the decoder. A frame's
/// error names its column; this names the file too, as a reader reports it.
fn decode_frames(snap: &Snapshot) -> trajstore::Result<u64> {
    let mut n = 0;
    for col in snap.frame_columns() {
        let mut dec = col.decoder()?;
        let mut buf = vec![0u8; dec.frame_len()];
        for seg in snap.segments() {
            let path = snap.path().join(&seg.entry().path);
            let ep_path = snap.path().join(&seg.entry().episodes_path);
            let bad = |p: &Path, e: Error| Error::corrupt(p, format!("frames: {e}"));
            let t = seg.episode_table();
            for i in 0..t.len() {
                let (start, len) = (t.row_starts()[i], t.lengths()[i] as usize);
                let run = seg
                    .frames(&col.name, start, len)
                    .map_err(|e| bad(&path, e))?;
                for r in 0..run.len() {
                    let f = run.frame(r).map_err(|e| bad(&path, e))?;
                    dec.decode_into(f, &mut buf).map_err(|e| bad(&path, e))?;
                    n += 1;
                }
                // The episode's final frame is the observation's (other columns have none).
                if let Some(f) = t.final_frame(i).filter(|_| col.name == "observation") {
                    dec.decode_into(f, &mut buf).map_err(|e| bad(&ep_path, e))?;
                }
            }
        }
    }
    Ok(n)
}

/// Samples and gathers a few batches of every column, frames stacked by 4.
fn gather_some(snap: &Snapshot) -> trajstore::Result<()> {
    let stack = snap
        .frame_column("observation")
        .map(|_| FrameStack::new(4))
        .transpose()?;
    let gatherer = Gatherer::with_frame_stack(
        snap,
        &["observation", "action", "reward", "next_observation"],
        stack,
    )?;
    if snap.num_episodes() > 0 {
        let policy = BoundaryPolicy::Pad;
        let index = snap.slice_index(8, policy)?;
        let sampler = SliceSampler::try_new(
            index,
            snap.episodes(),
            &SamplerSpec::uniform(8, 16).with_policy(policy).with_seed(3),
        )?;
        let (mut plan, mut batch) = (vec![], trajstore::Batch::default());
        for k in 0..3 {
            sampler.plan(k, &mut plan);
            gatherer.gather(&plan, &mut batch)?;
        }
    }
    Ok(())
}

/// Reads a dataset the way a training job does: open, catalog, snapshot, sample and gather a
/// few batches (frames stacked by 4), decode every frame, verify.
fn read_dataset(root: &Path) -> trajstore::Result<()> {
    let ds = Dataset::open(root)?;
    ds.catalog()?;
    let snap = ds.snapshot()?;
    // Frames stacked by the gather (decoded by its workers) on the damaged bytes first, then
    // every frame decoded. The gather's decode errors name the column, not the file: when the
    // decoding of every frame finds the damage too, its error (naming the file) is reported.
    let gathered = gather_some(&snap);
    decode_frames(&snap)?;
    gathered?;
    // Frame offsets are checked where they are read: a slice's by `episode`, a segment's all
    // by `batches` (opening checks only each record batch's first and last).
    let first = snap.episodes().first_id();
    for id in first..first + snap.num_episodes().min(3) {
        snap.episode(id)?;
    }
    for seg in snap.segments() {
        seg.batches()?;
    }
    trajstore::store::verify::verify(&snap, |_| {})?;
    Ok(())
}

/// Runs the library on one mutated case (its files under `case`), in a thread with a deadline.
fn run_library(kind: Kind, input: PathBuf, case: PathBuf) -> Option<Outcome> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let result = std::panic::catch_unwind(|| match kind {
            Kind::Ingest(format, _) => {
                let out = case.join("out.trajstore");
                let opts = IngestOptions::default().with_batch_rows(64);
                ingest(&input, format, &out, &opts, small_segments())?;
                // What was written reads back whole.
                read_dataset(&out).map_err(|e| {
                    trajstore::Error::invalid_argument(format!("ingested dataset unreadable: {e}"))
                })
            }
            Kind::Dqn => {
                let out = case.join("out.trajstore");
                ingest_dqn(&input, &out, &DqnOptions::default(), small_segments())?;
                read_dataset(&out).map_err(|e| {
                    trajstore::Error::invalid_argument(format!("ingested dataset unreadable: {e}"))
                })
            }
            Kind::Rlds => {
                let out = case.join("out.trajstore");
                ingest_rlds(&input, &out, &RldsOptions::default(), small_segments())?;
                read_dataset(&out).map_err(|e| {
                    trajstore::Error::invalid_argument(format!("ingested dataset unreadable: {e}"))
                })
            }
            Kind::Dataset => read_dataset(&input),
        });
        let _ = tx.send(match result {
            Ok(Ok(())) => Outcome::Accepted,
            Ok(Err(e)) => Outcome::Refused(chain(&e)),
            Err(p) => Outcome::Panicked(panic_text(p.as_ref())),
        });
    });
    rx.recv_timeout(DEADLINE).ok()
}

/// Runs the CLI with `args`, with a deadline: (exit code, or `None` for a signal; stderr), or
/// `None` on a hang (the child is killed).
fn run_cli(args: &[&std::ffi::OsStr]) -> Option<(Option<i32>, String)> {
    let mut child = crate::common::bin()
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .env("RUST_BACKTRACE", "0")
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut s).ok();
        s
    });
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some((status.code(), reader.join().unwrap()));
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `message` names the mutated file, the input or the dataset directory.
fn names_the_file(message: &str, root: &Path, file: &Path) -> bool {
    [root, file].iter().any(|p| {
        p.file_name()
            .is_some_and(|n| message.contains(n.to_string_lossy().as_ref()))
    })
}

#[test]
fn mutated_inputs_and_dataset_files_never_panic_and_errors_name_the_file() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let targets = targets(dir.path());
    // More cases, or other ones, for a longer hunt: MUTATION_SCALE=10 MUTATION_SEED=7.
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let scale = env("MUTATION_SCALE").unwrap_or(1) as usize;
    let mut rng = Rng(SEED ^ env("MUTATION_SEED").unwrap_or(0));
    let mut failures: Vec<String> = vec![];
    let (mut cases, mut accepted, mut refused, mut cli_runs) = (0usize, 0usize, 0usize, 0usize);
    for (t, target) in targets.iter().enumerate() {
        let refused_before = refused;
        let count = scale
            * match target.kind {
                Kind::Dataset => 40,
                _ => 30,
            };
        let pristine = target.content();
        let rel = target
            .file
            .strip_prefix(&target.root)
            .unwrap()
            .to_path_buf();
        for (m, mutation) in target.mutations(&mut rng, count).into_iter().enumerate() {
            cases += 1;
            let case = dir.path().join(format!("case-{t}-{m}"));
            std::fs::create_dir_all(&case).unwrap();
            let root = case.join(target.root.file_name().unwrap());
            if target.root.is_dir() {
                copy_tree(&target.root, &root);
            }
            let file = if rel.as_os_str().is_empty() {
                root.clone()
            } else {
                root.join(&rel)
            };
            std::fs::write(&file, target.encode(mutation.apply(&pristine))).unwrap();
            let what = format!("{} with {mutation:?}", target.name);
            match run_library(target.kind, root.clone(), case.clone()) {
                None => failures.push(format!(
                    "{what}: the library did not finish in {DEADLINE:?}"
                )),
                Some(Outcome::Panicked(p)) => failures.push(format!("{what}: panicked: {p}")),
                Some(Outcome::Accepted) => accepted += 1,
                Some(Outcome::Refused(e)) => {
                    refused += 1;
                    if !names_the_file(&e, &root, &file) {
                        failures.push(format!("{what}: the error names no file: {e}"));
                    }
                }
            }
            if cases % CLI_EVERY == 0 {
                let out = case.join("cli-out.trajstore");
                let commands: Vec<Vec<&std::ffi::OsStr>> = match target.kind {
                    Kind::Ingest(_, format) => vec![vec![
                        "ingest".as_ref(),
                        root.as_os_str(),
                        out.as_os_str(),
                        "--format".as_ref(),
                        format.as_ref(),
                    ]],
                    Kind::Dqn | Kind::Rlds => vec![vec![
                        "ingest".as_ref(),
                        root.as_os_str(),
                        out.as_os_str(),
                        "--format".as_ref(),
                        if target.kind == Kind::Dqn {
                            "dqn"
                        } else {
                            "rlds"
                        }
                        .as_ref(),
                    ]],
                    Kind::Dataset => vec![
                        vec!["verify".as_ref(), root.as_os_str()],
                        vec!["info".as_ref(), root.as_os_str()],
                    ],
                };
                for args in commands {
                    cli_runs += 1;
                    let cmd = format!("trajstore {}", args[0].to_string_lossy());
                    match run_cli(&args) {
                        None => failures.push(format!("{what}: `{cmd}` hung ({DEADLINE:?})")),
                        Some((code, err)) => {
                            if err.contains("panicked at")
                                || matches!(code, None | Some(101) | Some(134))
                            {
                                failures.push(format!(
                                    "{what}: `{cmd}` crashed (exit {code:?}): {err}"
                                ));
                            } else if code != Some(0) && !names_the_file(&err, &root, &file) {
                                failures.push(format!(
                                    "{what}: `{cmd}` failed without naming the file: {err}"
                                ));
                            }
                        }
                    }
                }
            }
            let _ = std::fs::remove_dir_all(&case);
        }
        eprintln!("  {}: {} refused", target.name, refused - refused_before);
    }
    eprintln!(
        "mutation: {cases} cases ({accepted} accepted, {refused} refused), {cli_runs} CLI runs, \
         {} failures, in {:.1} s",
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {cases} mutated inputs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
