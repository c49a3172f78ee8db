//! The `trajstore` binary: exit codes, one-line errors, JSON output, export.

use crate::common::run_cli as run;

#[test]
fn demo_info_verify_export() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("demo.trajstore");
    let d = d.to_str().unwrap();
    let (code, out, err) = run(&[
        "demo",
        d,
        "--transitions",
        "5000",
        "--mean-episode-len",
        "100",
        "--seed",
        "3",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("wrote 5,000 transitions"), "{out}");
    let (code, out, _) = run(&["info", d, "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["transitions"].as_u64(), Some(5000));
    let episodes = v["episodes"].as_u64().unwrap();
    assert!(episodes > 10);
    assert_eq!(
        v["terminated_episodes"].as_u64().unwrap() + v["truncated_episodes"].as_u64().unwrap(),
        episodes
    );
    assert_eq!(v["episode_length"]["count"].as_u64(), Some(episodes));
    assert!(
        (v["episode_length"]["mean"].as_f64().unwrap() * episodes as f64 - 5000.0).abs() < 1e-6
    );
    let (code, out, _) = run(&["info", d]);
    assert_eq!(code, 0);
    assert!(out.contains("episode length") && out.contains("█"), "{out}");
    let (code, out, _) = run(&["verify", d, "--json"]);
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["ok"],
        true
    );
    // Same seed, same bytes.
    let d2 = dir.path().join("again.trajstore");
    let d2 = d2.to_str().unwrap();
    run(&[
        "demo",
        d2,
        "--transitions",
        "5000",
        "--mean-episode-len",
        "100",
        "--seed",
        "3",
    ]);
    let seg = "segments/00000000000000000000.arrow";
    assert_eq!(
        std::fs::read(format!("{d}/{seg}")).unwrap(),
        std::fs::read(format!("{d2}/{seg}")).unwrap()
    );
    // Export to Parquet and read it back.
    let pq = dir.path().join("out.parquet");
    let (code, _, err) = run(&["export", d, pq.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        std::fs::File::open(&pq).unwrap(),
    )
    .unwrap()
    .build()
    .unwrap();
    let rows: usize = reader.map(|b| b.unwrap().num_rows()).sum();
    assert_eq!(rows, 5000);
}

#[test]
fn errors_are_one_line_with_exit_code_1_and_usage_errors_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let not_a_dataset = dir.path().join("notes");
    std::fs::create_dir(&not_a_dataset).unwrap();
    std::fs::write(not_a_dataset.join("todo.txt"), b"").unwrap();
    for args in [
        vec!["info", missing.to_str().unwrap()],
        vec!["verify", missing.to_str().unwrap()],
        vec!["demo", not_a_dataset.to_str().unwrap()],
        vec!["demo", "--transitions", "0", missing.to_str().unwrap()],
        vec!["ingest", "data.csv", missing.to_str().unwrap()],
    ] {
        let (code, out, err) = run(&args);
        assert_eq!(code, 1, "{args:?}: {out} {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{err}");
        assert!(!err.contains("panicked"));
    }
    // Help teaches and succeeds.
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("Examples:"));
    // A usage error keeps clap's exit code 2 (other failures are 1), and says what was wrong.
    let (code, _, err) = run(&["demo", "--no-such-flag"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--no-such-flag"), "{err}");
}

/// `bench --device`: the torch loader's figures in a `torch` build (batches were really produced,
/// on the CPU, and a bad device is one clear line), a clear pointer to the feature otherwise.
#[test]
fn bench_on_a_torch_device() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d.trajstore");
    let d = d.to_str().unwrap();
    let (code, _, err) = run(&[
        "demo",
        d,
        "--transitions",
        "20000",
        "--mean-episode-len",
        "50",
    ]);
    assert_eq!(code, 0, "{err}");
    let args = [
        "bench",
        d,
        "--slice-len",
        "8",
        "--num-slices",
        "16",
        "--iters",
        "10",
        "--json",
        "--device",
    ];
    let (code, out, err) = run(&[&args[..], &["cpu"]].concat());
    if cfg!(feature = "torch") {
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let t = &v["torch"];
        assert_eq!(t["device"], "cpu");
        assert_eq!(t["batches"].as_u64(), Some(10), "{t}");
        assert!(t["batches_per_s"].as_f64().unwrap() > 0.0, "{t}");
        assert!(
            t["pinned_copy_gb_per_s"].is_null(),
            "no CUDA baseline on CPU"
        );
        let (code, out, err) = run(&[&args[..], &["cpu", "--resident"]].concat());
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["torch"]["resident"], true);
        // The fused kernel's C++ copy on the CPU; libtorch operations with --resident-unfused.
        assert_eq!(v["torch"]["resident_gather"], "fused");
        // The kernel alone, timed beside the loader's rate (not with the unfused gather, nor
        // with the parameters read in place).
        let kernel = &v["torch"]["resident_kernel_us_per_batch"];
        assert!(kernel.as_f64().is_some_and(|k| k > 0.0), "{kernel}");
        // Where a batch's time goes: the consumer issuing it and waiting for its parameters (a
        // worker's planning too, unless the workers planned every batch during the warm-up, as
        // they may in a run this short); the text says so in one line.
        let w = &v["torch"]["worker_us_per_batch"];
        assert!(
            w["consumer_issue"].as_f64().is_some_and(|us| us > 0.0),
            "{w}"
        );
        assert!(
            w["consumer_wait"].as_f64().is_some_and(|us| us >= 0.0),
            "{w}"
        );
        assert!(
            w["gather"].is_null() || w["gather"].as_f64().unwrap() > 0.0,
            "{w}"
        );
        let text = [&args[..args.len() - 2], &["--device", "cpu", "--resident"]].concat();
        let (code, out, err) = run(&text);
        assert_eq!(code, 0, "{err}");
        assert!(
            out.lines()
                .any(|l| l.contains("a worker planning its parameters")
                    && l.contains("the consumer waiting for them")),
            "{out}"
        );
        let (code, out, err) =
            run(&[&args[..], &["cpu", "--resident", "--resident-unfused"]].concat());
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let gather = v["torch"]["resident_gather"].as_str().unwrap();
        assert!(gather.starts_with("unfused"), "{gather}");
        assert!(v["torch"]["resident_kernel_us_per_batch"].is_null());
        assert_eq!(v["torch"]["batches"].as_u64(), Some(10));
        // The fused kernel reading each batch's parameters in place (the workers' buffer).
        let (code, out, err) = run(&[
            &args[..],
            &["cpu", "--resident", "--resident-mapped-params"],
        ]
        .concat());
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            v["torch"]["resident_gather"],
            "fused, parameters read in place"
        );
        assert_eq!(v["torch"]["batches"].as_u64(), Some(10));
        let (code, _, err) = run(&[&args[..], &["tpu"]].concat());
        assert_eq!(code, 1);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains("cpu, cuda or cuda:N"), "{err}");
        let (code, _, err) = run(&[
            &args[..],
            &["cpu", "--resident", "--resident-budget", "1KiB"],
        ]
        .concat());
        assert_eq!(code, 1);
        assert!(err.contains("budget"), "{err}");
    } else {
        assert_eq!(code, 1);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains("--features torch"), "{err}");
    }
}

#[test]
fn ingest_numpy_says_which_columns_it_used() {
    let dir = tempfile::tempdir().unwrap();
    let npz = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/numpy/d4rl.npz");
    let d = dir.path().join("a.trajstore");
    let (code, out, err) = run(&["ingest", npz, d.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["rows"].as_u64(), Some(1000));
    assert_eq!(v["boundaries"], "flags terminals, timeouts");
    assert_eq!(v["columns"]["observation"], "observations");
    assert_eq!(v["columns"]["next_observation"], "next_observations");

    // Text output, appending to the same dataset; explicit options win over the conventions.
    let (code, out, err) = run(&[
        "ingest",
        npz,
        d.to_str().unwrap(),
        "--format",
        "numpy",
        "--terminated-col",
        "terminals",
        "--truncated-col",
        "timeouts",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("episodes from flags terminals, timeouts"),
        "{out}"
    );
    assert!(out.contains("observation <- observations"), "{out}");
    assert!(out.contains("ingested 1,000 transitions"), "{out}");
    let (_, out, _) = run(&["info", d.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["transitions"].as_u64(), Some(2000));

    let (code, out, _) = run(&["ingest", "--help"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("np.savez") && out.contains("--drop-cols"),
        "{out}"
    );
}

/// `bench --json --io-floor`: pages per batch, the disk reads of each phase, the loader on batches
/// no earlier phase read, and the disk's random-read floor with the loader's ratio to it; the
/// text output shows the same, and `--help` says how to measure a cold run.
#[test]
fn bench_reports_pages_phases_and_the_io_floor() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d.trajstore");
    let d = d.to_str().unwrap();
    let (code, _, err) = run(&["demo", d, "--transitions", "20000"]);
    assert_eq!(code, 0, "{err}");
    let args = [
        "bench",
        d,
        "--iters",
        "5",
        "--io-floor",
        "--io-floor-secs",
        "0.05",
    ];
    let (code, out, err) = run(&[&args[..], &["--json"]].concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"));
    assert!(f("pages_per_batch") > 0.0, "{v}");
    assert_eq!(v["bytes_per_batch"], v["batch_bytes"]);
    assert!(f("bytes_per_batch") > 0.0);
    assert!(f("page_size") >= 4096.0);
    // The loader starts after the single-threaded loop's batches 0..2*iters.
    assert_eq!(v["loader_first_batch"].as_u64(), Some(10));
    for p in ["open_and_first_batch", "single_thread", "loader"] {
        let p = &v["phases"][p];
        assert!(p["secs"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["batches"].as_u64().unwrap() > 0, "{p}");
        assert!(p["major_faults"].is_u64(), "{p}");
        assert!(p["disk_read_bytes"].is_u64(), "{p}");
    }
    assert_eq!(v["phases"]["loader"]["batches"].as_u64(), Some(5));
    // Every batch recycled: the workers made at most one batch per batch delivered.
    let made = v["loader_batches_made"].as_u64().unwrap();
    assert!((1..=5).contains(&made), "{made}");
    // Each of the 2 workers (the default) counted the batches it gathered: 5 in all.
    let per: Vec<u64> = serde_json::from_value(v["loader_batches_per_worker"].clone()).unwrap();
    assert_eq!((per.len(), per.iter().sum::<u64>()), (2, 5), "{per:?}");
    assert!(v["loader_consumer"]["step_us"].is_null(), "{v}");
    // A training step of 20 µs a batch: how long the consumer waited for the next batch.
    let (code, out, err) = run(&[&args[..], &["--consumer-us", "20", "--json"]].concat());
    assert_eq!(code, 0, "{err}");
    let c: serde_json::Value = serde_json::from_str(&out).unwrap();
    let c = &c["loader_consumer"];
    assert_eq!(c["step_us"].as_f64(), Some(20.0), "{c}");
    assert!(
        c["wait_us_per_batch"].as_f64().is_some_and(|w| w >= 0.0),
        "{c}"
    );
    assert!(
        c["waited_share"]
            .as_f64()
            .is_some_and(|s| (0.0..=1.0).contains(&s)),
        "{c}"
    );
    let (code, out, err) = run(&[&args[..], &["--consumer-us", "20"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("a 20 µs step a batch: waited"), "{out}");
    let (code, _, err) = run(&[&args[..], &["--consumer-us", "2e6"]].concat());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("a step of 0 to 1,000,000 µs"), "{err}");
    assert!(f("loader_disk_bytes_per_batch") >= 0.0);
    assert!(f("floor_batches_per_s") > 0.0, "{v}");
    assert!(f("loader_over_floor") > 0.0, "{v}");
    let io = &v["io_floor"];
    let qds: Vec<u64> = io["random_4k"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert!(r["ios_per_s"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["ios"].as_u64().unwrap() > 0, "{r}");
            assert_eq!(r["block"].as_u64(), Some(4096));
            r["queue_depth"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(qds, [1, 4, 16, 64, 256]);
    // Runs of adjacent pages: at least one per batch, never more than its pages.
    let runs = f("page_runs_per_batch");
    assert!(runs >= 1.0 && runs <= f("pages_per_batch"), "{io}");
    assert!(
        io["runs_floor_batches_per_s"].as_f64().unwrap() > 0.0,
        "{io}"
    );
    assert_eq!(io["bandwidth"]["block"].as_u64(), Some(1 << 20));
    assert!(
        io["bandwidth"]["bytes_per_s"].as_f64().unwrap() > 0.0,
        "{io}"
    );
    assert!(io["direct"].is_boolean());
    assert_eq!(io["files"].as_u64(), Some(1));
    // The floor is the lower of the two bounds.
    let bound = |r: &serde_json::Value| r["batches_per_s"].as_f64().unwrap();
    let floor = bound(&io["random_4k"][3]).min(bound(&io["bandwidth"]));
    assert!(
        (f("floor_batches_per_s") - floor).abs() <= 1e-9 * floor,
        "{io}"
    );

    // Without --io-floor the floor fields are null; the text output has the tables.
    let (code, out, err) = run(&["bench", d, "--iters", "5", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["io_floor"].is_null() && v["loader_over_floor"].is_null());
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{err}");
    for s in [
        "pages per batch",
        "major faults",
        "O_DIRECT",
        "loader / floor",
        "batches per worker",
    ] {
        assert!(
            out.contains(s) || (s == "O_DIRECT" && out.contains("buffered")),
            "{s}: {out}"
        );
    }
    let (code, out, _) = run(&["bench", "--help"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("drop_caches") && out.contains("--io-floor") && out.contains("--prefetch"),
        "{out}"
    );
    // A deeper queue gathers the same number of batches; an empty one is refused.
    let (code, out, err) = run(&["bench", d, "--iters", "5", "--prefetch", "32", "--json"]);
    assert_eq!(code, 0, "{err}");
    let p: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(p["phases"]["loader"]["batches"].as_u64(), Some(5), "{p}");
    let (code, _, err) = run(&["bench", d, "--prefetch", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--prefetch"), "{err}");
    // The hidden duration needs --io-floor and a sane value.
    let (code, _, err) = run(&["bench", d, "--io-floor", "--io-floor-secs", "0"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--io-floor-secs"), "{err}");
}
