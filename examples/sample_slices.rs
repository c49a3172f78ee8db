//! Writes a small synthetic dataset, then samples slices from it through the prefetching loader,
//! the way a training loop would.
//!
//! `cargo run --release --example sample_slices [DATASET]` (default: a temporary directory).

use std::time::Instant;

use trajstore::synth::SynthSpec;
use trajstore::{
    BatchSource, BoundaryPolicy, Dataset, Loader, LoaderOptions, LoaderSpec, SamplerSpec,
    WriterOptions,
};

fn main() -> trajstore::Result<()> {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let path = std::env::args()
        .nth(1)
        .map_or_else(|| tmp.path().join("example.trajstore"), Into::into);
    let ds = if path.exists() {
        Dataset::open(&path)?
    } else {
        let spec = SynthSpec {
            transitions: 500_000,
            ..SynthSpec::default()
        };
        let ds = Dataset::create(&path, &spec.schema()?)?;
        let mut w = ds.writer(WriterOptions::default())?;
        spec.write(&mut w, None, |_| {})?;
        ds
    };
    let snap = ds.snapshot()?;
    println!(
        "{}: {} transitions in {} episodes",
        path.display(),
        snap.num_transitions(),
        snap.num_episodes()
    );

    // What the batches are: 128 slices of 32 steps, padded at episode ends, these columns.
    let sampler = SamplerSpec::uniform(32, 128)
        .with_policy(BoundaryPolicy::Pad)
        .with_seed(1);
    let columns = ["observation", "action", "reward", "next_observation"];
    let source = BatchSource::open(LoaderSpec::single(snap, sampler, &columns))?;
    // How they are loaded: two background workers, 500 batches.
    let opts = LoaderOptions::default()
        .with_workers(2)
        .with_max_batches(500);
    let mut loader = Loader::new(&source, opts)?;

    let start = Instant::now();
    let (mut batches, mut steps, mut reward_sum) = (0, 0, 0.0f64);
    while let Some(batch) = loader.next_batch() {
        let reward: &[f32] = batch.column("reward").expect("requested").values();
        // Padded steps are zero and masked: sum only real ones.
        reward_sum += reward
            .iter()
            .zip(&batch.mask)
            .map(|(&r, &m)| r as f64 * m as f64)
            .sum::<f64>();
        steps += batch.valid_steps();
        batches += 1;
        loader.recycle(batch);
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{batches} batches of 128 x 32 ({steps} real steps, mean reward {:.3}) in {secs:.3} s: {:.0} batches/s",
        reward_sum / steps as f64,
        batches as f64 / secs
    );
    Ok(())
}
