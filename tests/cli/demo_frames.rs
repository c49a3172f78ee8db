//! `trajstore demo --frames`: pixel episodes as a zstd-dict frame column that info, verify and
//! a frame-stacked sample read.

use crate::common::run_cli as run;

#[test]
fn demo_frames_writes_a_compressed_frame_column_that_samples_in_stacks() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("pixels.trajstore");
    let d = d.to_str().unwrap();
    let (code, out, err) = run(&[
        "demo",
        d,
        "--frames",
        "--transitions",
        "3000",
        "--mean-episode-len",
        "200",
        "--seed",
        "5",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("wrote 3,000 transitions"), "{out}");

    let (code, out, err) = run(&["info", d, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["transitions"].as_u64(), Some(3000));
    let f = &v["frames"][0];
    assert_eq!(f["column"], "observation", "{v}");
    assert_eq!(f["codec"], "zstd-dict", "{v}");
    assert_eq!(
        f["level"].as_i64(),
        Some(trajstore::frames::DEFAULT_LEVEL.into()),
        "{v}"
    );
    assert_eq!(f["shape"], serde_json::json!([84, 84]));
    assert_eq!(f["frames"].as_u64(), Some(3000));
    assert!(f["dictionary_bytes"].as_u64().unwrap() > 0, "{f}");
    let per = f["bytes_per_frame"].as_f64().unwrap();
    assert!(per > 0.0 && per < 7056.0 / 20.0, "{per} B per frame: {f}");

    let (code, out, err) = run(&["verify", d, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["ok"],
        true,
        "{out}"
    );

    // One batch of 8 slices of 1 step, as JSON, with `extra` options.
    let shape = ["--slice-len", "1", "--num-slices", "8", "--json"];
    let sample = |extra: &[&str]| {
        let (code, out, err) = run(&[&["sample", d][..], &shape, extra].concat());
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let v = sample(&["--frame-stack", "4"]);
    let obs = v["columns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "observation")
        .unwrap_or_else(|| panic!("no observation: {v}"));
    assert_eq!(obs["shape"], serde_json::json!([8, 1, 4, 84, 84]), "{obs}");
    assert_eq!(obs["dtype"], "UInt8", "{obs}");

    // --frame-cache: the same slices and shapes (tests/gather/frame_cache.rs compares bytes);
    // without a stack, one frame per step as without the cache; bench reports what it holds.
    assert_eq!(sample(&["--frame-stack", "4", "--frame-cache", "64MiB"]), v);
    let one = sample(&["--frame-cache", "1MiB"]);
    assert_eq!(one, sample(&[]));
    assert_eq!(
        one["columns"][0]["shape"],
        serde_json::json!([8, 1, 84, 84]),
        "{one}"
    );
    let cached = ["--iters", "20", "--workers", "2", "--frame-cache", "10MiB"];
    let bench = [&["bench", d, "--frame-stack", "4"][..], &shape, &cached].concat();
    let (code, out, err) = run(&bench);
    assert_eq!(code, 0, "{err}");
    let b: serde_json::Value = serde_json::from_str(&out).unwrap();
    let c = &b["frame_cache"];
    // 10 MiB hold 1,486 whole frames of 7,056 bytes.
    assert_eq!(c["frames"].as_u64(), Some(10 * 1024 * 1024 / 7056), "{c}");
    assert_eq!(
        c["bytes"].as_u64(),
        Some(10 * 1024 * 1024 / 7056 * 7056),
        "{c}"
    );
    assert_eq!(c["frames_stored"].as_u64(), Some(3000), "{c}");
    let (code, _, err) = run(&["sample", d, "--frame-cache", "lots"]);
    assert_ne!(code, 0);
    assert!(err.contains("--frame-cache"), "{err}");

    // The same seed gives the same bytes; --help says what --frames writes.
    let d2 = dir.path().join("again.trajstore");
    let d2 = d2.to_str().unwrap();
    let args = [
        "--frames",
        "--transitions",
        "3000",
        "--mean-episode-len",
        "200",
        "--seed",
        "5",
    ];
    let (code, _, err) = run(&[&["demo", d2][..], &args[..]].concat());
    assert_eq!(code, 0, "{err}");
    let seg = "segments/00000000000000000000.arrow";
    assert_eq!(
        std::fs::read(format!("{d}/{seg}")).unwrap(),
        std::fs::read(format!("{d2}/{seg}")).unwrap()
    );
    let (code, out, _) = run(&["demo", "--help"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("--frames") && out.contains("84x84") && out.contains("zstd-dict"),
        "{out}"
    );
    // --frames fixes the observation: a shape or type beside it is refused.
    let (code, _, err) = run(&["demo", d2, "--frames", "--obs-shape", "64,64"]);
    assert_ne!(code, 0);
    assert!(err.contains("--obs-shape"), "{err}");
}
