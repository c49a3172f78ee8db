//! `trajstore verify`: checksums and boundary columns.

use std::time::Instant;

use anyhow::Result;
use indicatif::{HumanBytes, HumanCount, ProgressBar};
use serde_json::json;

use super::*;
use crate::open::*;
use crate::output::*;

pub(crate) fn run(a: VersionArgs) -> Result<()> {
    let snap = open_snapshot(&a.dataset, a.version)?;
    let pb = if a.json {
        ProgressBar::hidden()
    } else {
        progress(snap.num_transitions(), "verifying")
    };
    let start = Instant::now();
    let report = trajstore::store::verify::verify(&snap, |n| pb.inc(n))?;
    pb.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    if a.json {
        let mut v = serde_json::to_value(&report)?;
        v["ok"] = json!(true);
        v["seconds"] = json!(secs);
        outln!("{v}");
    } else {
        outln!(
            "ok: version {} — {} segments, {} transitions, {} episodes, {} checked{} in {:.2} s",
            report.version,
            report.segments,
            HumanCount(report.transitions),
            HumanCount(report.episodes),
            HumanBytes(report.bytes),
            match report.frames {
                0 => String::new(),
                n => format!(", {} frames decoded", HumanCount(n)),
            },
            secs
        );
    }
    Ok(())
}
