//! Frame columns (pixels, `src/frames.rs`, `src/store/dictionary.rs`, the writer's frame
//! encoding): every codec round-trips gray and color frames bit-exactly through a dataset, final
//! frames are kept, the trained dictionary is stored, reused and checked on open, and damaged
//! frames or dictionaries are named errors.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, FixedSizeListArray, Float32Array, Int64Array, RecordBatch, UInt8Array,
};
use arrow::datatypes::{DataType, Field};
use trajstore::frames::{FrameCodec, FrameDecoder};
use trajstore::{Dataset, EpisodeEnd, Error, Snapshot, TransitionSchema, WriterOptions};

/// An Atari-like frame: a flat background, a border, a paddle and a ball that move with `t`.
pub fn frame(shape: &[usize], seed: usize, t: usize) -> Vec<u8> {
    let (h, w) = (shape[0], shape[1]);
    let c = shape.get(2).copied().unwrap_or(1);
    let mut f = vec![87u8; h * w * c];
    for y in 0..h {
        for x in 0..w {
            let border = y < 2 || y >= h - 2;
            let paddle = x >= w - 4 && x < w - 2 && (y + 40 - (t * 3 + seed) % 40) % h < 8;
            let ball = (y as isize - ((t * 5 + seed) % h) as isize).abs() < 2
                && (x as isize - ((t * 7) % w) as isize).abs() < 2;
            let v: u8 = if border {
                236
            } else if paddle {
                147
            } else if ball {
                255
            } else {
                87
            };
            for k in 0..c {
                f[(y * w + x) * c + k] = v.wrapping_add((k * 30) as u8);
            }
        }
    }
    f
}

fn frames_array(frames: &[Vec<u8>], len: usize) -> ArrayRef {
    let values: Vec<u8> = frames.concat();
    let item = Arc::new(Field::new("item", DataType::UInt8, false));
    Arc::new(FixedSizeListArray::new(
        item,
        len as i32,
        Arc::new(UInt8Array::from(values)),
        None,
    ))
}

/// Appends `episodes` episodes of `len` steps of frames of `shape` (each with its final frame)
/// and returns every episode's frames, final frame last.
pub fn write_episodes(
    ds: &Dataset,
    shape: &[usize],
    episodes: usize,
    len: usize,
) -> Vec<Vec<Vec<u8>>> {
    let n: usize = shape.iter().product();
    let mut w = ds.writer(WriterOptions::default()).unwrap();
    let mut all = vec![];
    for e in 0..episodes {
        let frames: Vec<Vec<u8>> = (0..=len).map(|t| frame(shape, e * 13, t)).collect();
        let batch = RecordBatch::try_from_iter([
            ("observation", frames_array(&frames[..len], n)),
            (
                "action",
                Arc::new(Int64Array::from_iter_values(0..len as i64)) as _,
            ),
            (
                "reward",
                Arc::new(Float32Array::from(vec![1.0f32; len])) as _,
            ),
        ])
        .unwrap();
        let end = EpisodeEnd::truncated().with_final_observation(frames_array(&frames[len..], n));
        w.append_episode(&batch, end).unwrap();
        all.push(frames);
    }
    w.commit().unwrap();
    all
}

pub fn frame_schema(codec: FrameCodec, shape: &[usize]) -> TransitionSchema {
    TransitionSchema::builder(&[1], 1)
        .frames(codec, shape)
        .discrete_action()
        .build()
        .unwrap()
}

/// Decodes every frame of `snap` (episode by episode, final frame last).
pub fn decode_all(snap: &Snapshot) -> trajstore::Result<Vec<Vec<Vec<u8>>>> {
    let col = snap.frame_column("observation").expect("a frame column");
    let mut dec: FrameDecoder = col.decoder()?;
    let mut out = vec![];
    for seg in snap.segments() {
        let t = seg.episode_table();
        for (i, (&start, &len)) in t.row_starts().iter().zip(t.lengths()).enumerate() {
            let run = seg.frames("observation", start, len as usize)?;
            let mut ep = vec![];
            for r in 0..run.len() {
                let mut buf = vec![0u8; dec.frame_len()];
                dec.decode_into(run.frame(r)?, &mut buf)?;
                ep.push(buf);
            }
            let fin = t.final_frame(i).expect("a final frame");
            let mut buf = vec![0u8; dec.frame_len()];
            dec.decode_into(fin, &mut buf)?;
            ep.push(buf);
            out.push(ep);
        }
    }
    Ok(out)
}

#[test]
fn every_codec_round_trips_gray_and_color_frames_bit_exactly() {
    for codec in [FrameCodec::ZstdDict, FrameCodec::Zstd, FrameCodec::None] {
        for shape in [vec![84usize, 84], vec![24, 32, 3]] {
            let dir = tempfile::tempdir().unwrap();
            let ds = Dataset::create(dir.path().join("f"), &frame_schema(codec, &shape)).unwrap();
            let want = write_episodes(&ds, &shape, 12, 40);
            let snap = ds.snapshot().unwrap();
            let col = snap.frame_column("observation").unwrap();
            assert_eq!(col.spec.codec, codec, "{shape:?}");
            assert_eq!(col.spec.shape, shape);
            assert_eq!(snap.schema().observation_shape(), &shape[..]);
            assert_eq!(col.dictionary.is_some(), codec == FrameCodec::ZstdDict);
            assert_eq!(decode_all(&snap).unwrap(), want, "{codec} {shape:?}");
            // The manifest's column names codec, shape, dtype (and dictionary).
            let m = serde_json::to_value(snap.manifest()).unwrap();
            let c = &m["columns"][6];
            assert_eq!(c["type"], "large_binary");
            assert_eq!(c["frame"]["codec"], codec.as_str());
            assert_eq!(c["frame"]["dtype"], "uint8");
        }
    }
}

#[test]
fn the_dictionary_is_trained_once_reused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let shape = [84, 84];
    let ds = Dataset::create(
        dir.path().join("f"),
        &frame_schema(FrameCodec::ZstdDict, &shape),
    )
    .unwrap();
    let first = write_episodes(&ds, &shape, 30, 200);
    let dict = ds.snapshot().unwrap().manifest().columns[6]
        .frame
        .clone()
        .unwrap();
    let r = dict.dictionary.clone().expect("a trained dictionary");
    assert!(dir.path().join("f").join(&r.path).is_file());
    // A second writer reuses it; vacuum of old versions keeps it.
    let second = write_episodes(&ds, &shape, 3, 10);
    let snap = ds.snapshot().unwrap();
    assert_eq!(
        snap.manifest().columns[6]
            .frame
            .as_ref()
            .unwrap()
            .dictionary,
        Some(r.clone())
    );
    let w = ds.writer(WriterOptions::default()).unwrap();
    w.vacuum(1, std::time::Duration::ZERO).unwrap();
    drop(w);
    assert!(dir.path().join("f").join(&r.path).is_file());
    let all = decode_all(&ds.snapshot().unwrap()).unwrap();
    assert_eq!(all, [first, second].concat());
    // Compression pays on these frames: well under a tenth of the raw bytes per frame.
    let bytes: u64 = snap.manifest().segments.iter().map(|s| s.bytes).sum();
    let frames = snap.num_transitions();
    assert!(bytes / frames < 7056 / 10, "{} B per frame", bytes / frames);
}

/// Writes 6 episodes of 40 camera-sized frames (`[160, 160, 3]`, 76,800 B) made by `make(episode,
/// step)` with the `zstd-dict` codec and returns the stored column's spec and whether every frame
/// came back.
fn large_frames(make: impl Fn(usize, usize) -> Vec<u8>) -> (trajstore::frames::FrameSpec, bool) {
    let shape = [160usize, 160, 3];
    let n: usize = shape.iter().product();
    let dir = tempfile::tempdir().unwrap();
    let ds = Dataset::create(
        dir.path().join("f"),
        &frame_schema(FrameCodec::ZstdDict, &shape),
    )
    .unwrap();
    let mut w = ds.writer(WriterOptions::default()).unwrap();
    let mut want = vec![];
    for e in 0..6 {
        let frames: Vec<Vec<u8>> = (0..=40).map(|t| make(e, t)).collect();
        let batch = RecordBatch::try_from_iter([
            ("observation", frames_array(&frames[..40], n)),
            ("action", Arc::new(Int64Array::from_iter_values(0..40)) as _),
            (
                "reward",
                Arc::new(Float32Array::from(vec![0.0f32; 40])) as _,
            ),
        ])
        .unwrap();
        let end = EpisodeEnd::truncated().with_final_observation(frames_array(&frames[40..], n));
        w.append_episode(&batch, end).unwrap();
        want.push(frames);
    }
    w.commit().unwrap();
    let snap = ds.snapshot().unwrap();
    let spec = snap.frame_column("observation").unwrap().spec.clone();
    (spec, decode_all(&snap).unwrap() == want)
}

/// A byte of noise from a seed (splitmix64).
fn noise(seed: u64) -> u8 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u8
}

#[test]
fn camera_sized_frames_keep_a_dictionary_only_where_it_pays() {
    // Sensor noise everywhere: a 16 KiB dictionary cannot predict it; the column is stored with
    // plain zstd and no dictionary (and says so in its spec).
    let (spec, exact) = large_frames(|e, t| {
        (0..76_800)
            .map(|i| noise(((e * 41 + t) * 76_800 + i) as u64))
            .collect()
    });
    assert!(exact);
    assert_eq!(spec.codec, FrameCodec::Zstd);
    assert!(spec.dictionary.is_none());
    // The same noisy 8 KiB patch in every frame (a fixed texture) over a flat scene: the
    // dictionary holds the patch and pays; it is kept.
    let (spec, exact) = large_frames(|e, t| {
        let mut f = frame(&[160, 160, 3], e * 13, t);
        for (i, v) in f[..8192].iter_mut().enumerate() {
            *v = noise(i as u64);
        }
        f
    });
    assert!(exact);
    assert_eq!(spec.codec, FrameCodec::ZstdDict);
    assert!(spec.dictionary.is_some());
}

#[test]
fn a_bad_dictionary_is_a_named_error_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("f");
    let shape = [84, 84];
    let ds = Dataset::create(&root, &frame_schema(FrameCodec::ZstdDict, &shape)).unwrap();
    write_episodes(&ds, &shape, 10, 50);
    let r = ds.snapshot().unwrap().manifest().columns[6]
        .frame
        .clone()
        .unwrap()
        .dictionary
        .unwrap();
    let path = root.join(&r.path);
    let good = std::fs::read(&path).unwrap();
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x55;
    for (what, bytes) in [
        ("flipped", Some(bad)),
        ("cut", Some(good[..100].to_vec())),
        ("gone", None),
    ] {
        match &bytes {
            Some(b) => std::fs::write(&path, b).unwrap(),
            None => std::fs::remove_file(&path).unwrap(),
        }
        match ds.snapshot() {
            Err(Error::Corrupt { path: p, .. }) => assert_eq!(p, path, "{what}"),
            other => panic!("{what}: {other:?}"),
        }
        // The writer refuses too (it would encode with the wrong dictionary).
        assert!(matches!(
            ds.writer(WriterOptions::default()),
            Err(Error::Corrupt { .. })
        ));
    }
    std::fs::write(&path, &good).unwrap();
    ds.snapshot().unwrap();
}

#[test]
fn damaged_frames_are_named_errors_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let shape = [84, 84];
    let ds = Dataset::create(
        dir.path().join("f"),
        &frame_schema(FrameCodec::ZstdDict, &shape),
    )
    .unwrap();
    write_episodes(&ds, &shape, 4, 20);
    let snap = ds.snapshot().unwrap();
    let mut dec = snap.frame_column("observation").unwrap().decoder().unwrap();
    let run = snap.segments()[0].frames("observation", 0, 20).unwrap();
    let good = run.frame(3).unwrap().to_vec();
    let mut out = vec![0u8; 84 * 84];
    for cut in 0..good.len() {
        let e = dec.decode_into(&good[..cut], &mut out).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidData { column: Some(c), .. } if c == "observation"),
            "{e}"
        );
    }
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0xA5;
        // A flipped byte either fails or decodes to some frame of the right size; never panics.
        let _ = dec.decode_into(&bad, &mut out);
    }
    assert!(dec.decode_into(&good, &mut [0u8; 10]).is_err());
    assert!(snap.segments()[0].frames("reward", 0, 2).is_err());
    assert!(snap.segments()[0].frames("observation", 70, 20).is_err());
}

/// The ten-line decoder of schemas/FORMAT.md section 3.1, run as written (pyarrow + zstandard),
/// gives back the frames written, for every codec; Polars and DuckDB read the column as binary.
#[test]
fn the_python_decoder_of_format_md_reads_the_frames() {
    let Some(py) = crate::common::python_with("pyarrow, numpy, zstandard", "the frame decoder")
    else {
        return;
    };
    let md = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/FORMAT.md"),
    )
    .unwrap();
    let after = md
        .split("Reading frames needs no trajstore")
        .nth(1)
        .unwrap();
    let code = after
        .split("```python\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    assert!(code.lines().count() <= 11, "the decoder is about ten lines");
    for codec in [FrameCodec::ZstdDict, FrameCodec::Zstd, FrameCodec::None] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("f");
        let shape = [84, 84];
        let ds = Dataset::create(&root, &frame_schema(codec, &shape)).unwrap();
        let want = write_episodes(&ds, &shape, 6, 30);
        let rows: Vec<u8> = want
            .iter()
            .flat_map(|e| e[..e.len() - 1].concat())
            .collect();
        std::fs::write(dir.path().join("want.bin"), &rows).unwrap();
        let script = format!(
            "import json, os, re\n\
             root = {root:?}\n\
             v = sorted(n for n in os.listdir(f'{{root}}/_versions') if re.fullmatch(r'\\d{{20}}\\.json', n))\n\
             manifest = json.load(open(f'{{root}}/_versions/{{v[-1]}}'))\n\
             {code}\n\
             want = np.fromfile({want:?}, np.uint8).reshape(frames.shape)\n\
             assert (frames == want).all(), 'frames differ'\n\
             try:\n    import duckdb\n    n = duckdb.sql('SELECT sum(octet_length(observation)) FROM t').fetchall()[0][0]\n    assert n == sum(len(b) for b in t.column('observation').to_pylist()), n\n\
             except ImportError:\n    pass\n\
             try:\n    import polars as pl\n    assert pl.read_ipc(f\"{{root}}/{{manifest['segments'][0]['path']}}\")['observation'].dtype == pl.Binary\n\
             except ImportError:\n    pass\n\
             print('ok', frames.shape)\n",
            root = root.display().to_string(),
            want = dir.path().join("want.bin").display().to_string(),
        );
        let out = std::process::Command::new(&py)
            .args(["-c", &script])
            .output()
            .unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).starts_with("ok"),
            "{codec}: {}\n{script}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Opening a segment does not read its frame offsets (8 bytes a frame: 1.7 GB at 209M
/// frames); each reader checks the offsets it reads. A damaged offset in the middle of a record
/// batch (its first and last are checked on open) therefore opens, and is then a named error
/// from every reader of those rows, never a panic; rows away from it still read.
#[test]
fn a_damaged_frame_offset_is_found_where_it_is_read() {
    use trajstore::{FrameStack, Gatherer, SliceRef, gather::Batch};
    let dir = tempfile::tempdir().unwrap();
    let shape = [84, 84];
    let root = dir.path().join("f");
    let ds = Dataset::create(&root, &frame_schema(FrameCodec::Zstd, &shape)).unwrap();
    let want = write_episodes(&ds, &shape, 4, 20);
    let snap = ds.snapshot().unwrap();
    let seg = &snap.segments()[0];
    assert_eq!(seg.batches().unwrap().len(), 1, "one record batch");
    // The offsets of rows 5, 6, 7 of the batch, as written in the file.
    let run = seg.frames("observation", 0, 8).unwrap();
    let mut offsets = vec![0i64];
    for i in 0..8 {
        offsets.push(offsets[i] + run.frame(i).unwrap().len() as i64);
    }
    let pattern: Vec<u8> = offsets[5..8].iter().flat_map(|o| o.to_le_bytes()).collect();
    let file = root.join(&seg.entry().path);
    drop(snap);
    drop(ds);
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes
        .windows(pattern.len())
        .position(|w| w == pattern)
        .expect("the offsets are in the file")
        + 8;
    bytes[at..at + 8].copy_from_slice(&(1i64 << 40).to_le_bytes());
    std::fs::write(&file, &bytes).unwrap();

    let snap = Dataset::open(&root).and_then(|d| d.snapshot()).unwrap();
    let seg = &snap.segments()[0];
    let corrupt_here = |e: Error, what: &str| match e {
        Error::Corrupt { path, reason } => {
            assert_eq!(path, file, "{what}");
            assert!(reason.contains("observation"), "{what}: {reason}");
        }
        other => panic!("{what}: {other:?}"),
    };
    // Episode 1 (rows 20..40) reads, whole or gathered; episode 0's damaged rows do not.
    let e1 = snap.episode(1).unwrap().unwrap();
    assert_eq!(e1.num_rows(), 20);
    corrupt_here(snap.episode(0).unwrap_err(), "episode 0");
    corrupt_here(seg.slice(4, 3).unwrap_err(), "rows 4..7");
    assert_eq!(seg.slice(7, 5).unwrap().num_rows(), 5);
    let g = Gatherer::with_frame_stack(&snap, &["observation"], Some(FrameStack::new(2).unwrap()))
        .unwrap();
    let mut batch = Batch::default();
    let slice = |episode, start| SliceRef {
        episode,
        start,
        len: 4,
    };
    g.gather(&[slice(1, 3)], &mut batch).unwrap();
    let stacks = batch.column("observation").unwrap().data.as_slice();
    let n = 84 * 84;
    // Step 3's stack of episode 1 is frames 2, 3.
    assert_eq!(&stacks[..n], &want[1][2][..]);
    assert_eq!(&stacks[n..2 * n], &want[1][3][..]);
    let e = g.gather(&[slice(0, 4)], &mut batch).unwrap_err();
    assert!(e.to_string().contains("observation"), "{e}");
    // Readers of whole segments check every offset first.
    corrupt_here(seg.batches().unwrap_err(), "batches");
    corrupt_here(seg.column("observation").unwrap_err(), "column");
    assert!(seg.column("reward").is_ok(), "other columns read");
    let e = trajstore::store::verify::verify(&snap, |_| {}).unwrap_err();
    assert!(e.to_string().contains(&seg.entry().path), "{e}");
    // `info` reads only each batch's first and last offsets: it still reports.
    let stats = trajstore::store::info::frame_stats(&snap);
    assert_eq!(stats[0].frames, 80);
    #[cfg(feature = "sql")]
    {
        let s = trajstore::sql::SqlSession::try_new(&snap).unwrap();
        let count = s.query("SELECT count(*) AS n FROM transitions").unwrap();
        assert_eq!(
            count.batches[0].num_rows(),
            1,
            "a scan without the frames reads"
        );
        let e = s
            .query("SELECT sum(octet_length(observation)) FROM transitions")
            .unwrap_err();
        assert!(e.to_string().contains(&seg.entry().path), "{e}");
    }
}
