//! `trajstore bench`'s text output beside its measurements: the `--io-floor` table, and the
//! loader under a training step of `--consumer-us`, the decoded-frame cache.

use indicatif::{HumanBytes, HumanCount};

/// The `--io-floor` table and the loader's fraction of the floor, as text.
pub(crate) fn print_io_floor(f: &serde_json::Value, loader_bps: f64) {
    let num = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    outln!("");
    outln!(
        "disk random reads      {} over {} segment file{} ({}){}",
        if f["direct"] == true {
            "O_DIRECT"
        } else {
            "buffered"
        },
        f["files"],
        if f["files"] == 1 { "" } else { "s" },
        HumanBytes(f["file_bytes"].as_u64().unwrap_or(0)),
        if f["direct"] == true {
            ""
        } else {
            " - the file system refused O_DIRECT: cached pages make these optimistic"
        }
    );
    outln!(
        "  {:>7} {:>5} {:>12} {:>12} {:>16}",
        "block",
        "QD",
        "reads/s",
        "bytes/s",
        "batches/s bound"
    );
    let rows = f["random_4k"]
        .as_array()
        .into_iter()
        .flatten()
        .chain([&f["bandwidth"]]);
    for r in rows {
        outln!(
            "  {:>7} {:>5} {:>12} {:>12} {:>16.1}",
            HumanBytes(r["block"].as_u64().unwrap_or(0)).to_string(),
            r["queue_depth"].as_u64().unwrap_or(0),
            HumanCount(num(r, "ios_per_s") as u64).to_string(),
            format!("{}/s", HumanBytes(num(r, "bytes_per_s") as u64)),
            num(r, "batches_per_s")
        );
    }
    let floor = num(f, "floor_batches_per_s");
    let runs_floor = num(f, "runs_floor_batches_per_s");
    outln!(
        "floor                  {floor:>10.1} batches/s  (one 4 KiB read per page at QD 64, or bandwidth)"
    );
    outln!(
        "runs floor             {runs_floor:>10.1} batches/s  (one read per run of adjacent pages, best QD)"
    );
    outln!(
        "loader / floor         {:>10.2}x  / runs floor {:.2}x  ({loader_bps:.1} batches/s; see the loader's disk reads above for how cold it was)",
        loader_bps / floor,
        loader_bps / runs_floor,
    );
}

/// The loader phase's line under `--consumer-us`: the step, how long the consumer waited for
/// batches, and how many batches the workers made rather than reused.
pub(crate) fn print_consumer(v: &serde_json::Value) {
    let c = &v["loader_consumer"];
    let Some(step) = c["step_us"].as_f64() else {
        return;
    };
    let num = |k: &str| c[k].as_f64().unwrap_or(f64::NAN);
    outln!(
        "  a {step:.0} µs step a batch: waited {:.1} µs a batch for the next (mean), {:.1}% of \
         batches waited over 10 µs; {} batches made, not reused",
        num("wait_us_per_batch"),
        100.0 * num("waited_share"),
        v["loader_batches_made"]
    );
}

/// The decoded-frame cache's line (`--frame-cache`), if there is one.
pub(crate) fn print_frame_cache(c: &serde_json::Value) {
    let n = |k: &str| c[k].as_u64().unwrap_or(0);
    if n("frames") == 0 {
        return;
    }
    outln!(
        "  frame cache          {} of {} frames decoded in memory ({}), filled in {:.2} s \
         (included above)",
        HumanCount(n("frames")),
        HumanCount(n("frames_stored")),
        HumanBytes(n("bytes")),
        c["fill_seconds"].as_f64().unwrap_or(f64::NAN)
    );
}
