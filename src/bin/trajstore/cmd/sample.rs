//! `trajstore sample`: one batch of slices, shown.

use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;
use indicatif::{HumanBytes, HumanCount};
use serde_json::json;
use trajstore::Snapshot;

use super::*;
use crate::open::*;

#[derive(Args)]
pub(crate) struct SampleArgs {
    #[command(flatten)]
    s: SliceArgs,
    /// Which batch number of the seeded stream to show.
    #[arg(long, default_value_t = 0)]
    batch: u64,
}

/// The uniform sampler of `a` (what a loader's [`trajstore::LoaderSpec`] takes), with the
/// `--episodes` query resolved.
#[cfg_attr(not(feature = "sql"), allow(unused_variables))]
pub(crate) fn slice_spec(snap: &Snapshot, a: &SliceArgs) -> Result<trajstore::SamplerSpec> {
    let spec = trajstore::SamplerSpec::uniform(a.slice_len, a.num_slices)
        .with_policy(a.policy)
        .with_weighting(a.weighting)
        .with_seed(a.seed);
    spec.validate()?;
    Ok(match &a.episodes {
        #[cfg(feature = "sql")]
        Some(q) => {
            use trajstore::sql::SnapshotSql;
            let ids = snap.episodes_where(q).map_err(crate::output::one_line)?;
            if ids.is_empty() {
                bail!("--episodes: the query returned no episode");
            }
            spec.with_episode_ids(ids)
        }
        #[cfg(not(feature = "sql"))]
        Some(_) => bail!("--episodes needs SQL: rebuild with the `sql` feature (on by default)"),
        None => spec,
    })
}

/// The sampler of `a` over `snap`.
pub(crate) fn slice_sampler(
    snap: &Snapshot,
    a: &SliceArgs,
) -> Result<std::sync::Arc<dyn trajstore::Sampler>> {
    Ok(slice_spec(snap, a)?.build(snap)?.sampler)
}

pub(crate) fn demo_sample(snap: &Snapshot) -> Result<String> {
    let args = SliceArgs {
        dataset: snap.path().to_path_buf(),
        slice_len: 64,
        num_slices: 256,
        policy: trajstore::BoundaryPolicy::Strict,
        weighting: trajstore::Weighting::Windows,
        seed: 0,
        columns: vec!["observation".into(), "action".into(), "reward".into()],
        json: false,
        episodes: None,
        frame_stack: None,
        frame_pad: trajstore::StackPad::Repeat,
        channels_last: false,
        frame_window: false,
        frame_cache: None,
    };
    let sampler = slice_sampler(snap, &args)?;
    let gatherer = args.gatherer(snap)?;
    let mut plan = vec![];
    let mut batch = trajstore::Batch::default();
    let t = Instant::now();
    let iters = 100;
    for k in 0..iters {
        sampler.plan(k, &mut plan);
        gatherer.gather(&plan, &mut batch)?;
    }
    let per = t.elapsed().as_secs_f64() / iters as f64;
    Ok(format!(
        "\nsampled {iters} batches of 256 slices x 64 steps ({} per batch): {:.1} us per batch, {}/s transitions\n",
        HumanBytes(batch.data_bytes() as u64),
        per * 1e6,
        HumanCount((256.0 * 64.0 / per) as u64)
    ))
}

pub(crate) fn run(a: SampleArgs) -> Result<()> {
    let snap = open_snapshot(&a.s.dataset, None)?;
    let gatherer = a.s.gatherer(&snap)?;
    check_batch_size(&gatherer, &a.s)?;
    let sampler = slice_sampler(&snap, &a.s)?;
    let mut plan = vec![];
    sampler.plan(a.batch, &mut plan);
    let mut batch = trajstore::Batch::default();
    gatherer.gather(&plan, &mut batch)?;
    let l = batch.slice_len;
    let slices: Vec<_> = (0..batch.num_slices)
        .map(|i| {
            let valid: usize = batch.mask[i * l..(i + 1) * l].iter().map(|&m| m as usize).sum();
            json!({"episode_id": batch.episode_id[i], "start_step": batch.start_step[i], "len": l, "valid": valid})
        })
        .collect();
    if a.s.json {
        let v = json!({
            "version": snap.version(), "slice_len": l, "num_slices": batch.num_slices,
            "valid_steps": batch.valid_steps(), "bytes": batch.data_bytes(),
            "columns": batch.columns.iter().map(|c| {
                let shape: Vec<usize> = [batch.num_slices, l].into_iter().chain(c.shape.iter().copied()).collect();
                json!({"name": c.name, "dtype": c.data_type.to_string(), "shape": shape})
            }).collect::<Vec<_>>(),
            "slices": slices,
        });
        outln!("{v}");
        return Ok(());
    }
    outln!(
        "batch {} of version {}: {} slices x {} steps, {} valid steps, {}",
        a.batch,
        snap.version(),
        batch.num_slices,
        l,
        batch.valid_steps(),
        HumanBytes(batch.data_bytes() as u64)
    );
    for c in &batch.columns {
        let mut shape = vec![batch.num_slices, l];
        shape.extend(&c.shape);
        outln!("  {:<18} {:?} {}", c.name, shape, c.data_type);
    }
    outln!(
        "  {:>5} {:>12} {:>11} {:>6}",
        "slice",
        "episode_id",
        "start_step",
        "valid"
    );
    for (i, s) in slices.iter().enumerate().take(20) {
        outln!(
            "  {:>5} {:>12} {:>11} {:>6}",
            i,
            s["episode_id"],
            s["start_step"],
            s["valid"]
        );
    }
    if slices.len() > 20 {
        outln!("  ... {} more (use --json for all)", slices.len() - 20);
    }
    Ok(())
}
