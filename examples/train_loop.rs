//! A minimal offline-RL training loop: behaviour cloning (an MLP from observation to action,
//! masked MSE over 256 slices x 16 steps) fed by the torch loader, with each step's time split
//! into waiting for data and computing, to show whether the GPU ever waits.
//!
//! ```sh
//! eval "$(scripts/setup-libtorch.sh)"
//! cargo run --release --features torch --example train_loop -- [DATASET] [--device cuda] [--steps 500] [--resident]
//! ```
//!
//! Without a DATASET a 500K-transition synthetic one is written to a temporary directory.

use std::time::{Duration, Instant};

use tch::nn::{self, Module, OptimizerConfig};
use tch::{Kind, Tensor};
use trajstore::synth::SynthSpec;
use trajstore::torch::{TorchLoader, TorchLoaderOptions, parse_device};
use trajstore::{BatchSource, Dataset, LoaderOptions, LoaderSpec, SamplerSpec, WriterOptions};

fn main() -> trajstore::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let device = parse_device(&flag("--device").unwrap_or_else(|| "cpu".into()))?;
    let steps: usize = flag("--steps").and_then(|s| s.parse().ok()).unwrap_or(300);
    let resident = args.iter().any(|a| a == "--resident");
    let tmp = tempfile::tempdir().expect("temporary directory");
    let path = args
        .first()
        .filter(|a| !a.starts_with("--"))
        .map_or_else(|| tmp.path().join("bc.trajstore"), Into::into);
    let ds = if path.exists() {
        Dataset::open(&path)?
    } else {
        let spec = SynthSpec {
            transitions: 500_000,
            ..SynthSpec::default()
        };
        let ds = Dataset::create(&path, &spec.schema()?)?;
        spec.write(&mut ds.writer(WriterOptions::default())?, None, |_| {})?;
        ds
    };
    let snap = ds.snapshot()?;

    let (slices, len) = (256, 16);
    let sampler = SamplerSpec::uniform(len, slices).with_seed(1);
    let source = BatchSource::open(LoaderSpec::single(
        snap,
        sampler,
        &["observation", "action"],
    ))?;
    let (_, gatherer) = source.at(0).expect("a local dataset");
    let obs_dim = gatherer
        .columns()
        .next()
        .map_or(1, |(_, _, s)| s.iter().product()) as i64;
    let act_dim = gatherer
        .columns()
        .nth(1)
        .map_or(1, |(_, _, s)| s.iter().product()) as i64;
    let mut opts = TorchLoaderOptions::new(device).with_loader(
        LoaderOptions::default()
            .with_workers(2)
            .with_prefetch(4)
            .with_max_batches(steps as u64),
    );
    if resident {
        opts = opts.with_resident(8 << 30);
    }
    let mut loader = TorchLoader::new(&source, opts)?;

    let vs = nn::VarStore::new(device);
    let root = vs.root();
    let policy = nn::seq()
        .add(nn::linear(&root / "l1", obs_dim, 256, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(&root / "l2", 256, 256, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(&root / "l3", 256, act_dim, Default::default()));
    let mut opt = nn::Adam::default().build(&vs, 1e-3)?;

    let (mut waited, mut computed) = (Duration::ZERO, Duration::ZERO);
    let mut t = Instant::now();
    let mut step = 0;
    while let Some(batch) = loader.next_batch() {
        let batch = batch?;
        let got = Instant::now();
        waited += got - t;
        let obs = batch.get("observation").expect("requested");
        let act = batch.get("action").expect("requested");
        let mask = batch.mask.to_kind(Kind::Float).unsqueeze(-1);
        let pred = policy.forward(obs);
        let err: Tensor = (pred - act).square() * &mask;
        let loss = err.sum(Kind::Float) / (mask.sum(Kind::Float) * act_dim as f64);
        opt.backward_step(&loss);
        // Reading the loss waits for the step's kernels, so `computed` is the real compute time.
        let l = loss.double_value(&[]);
        t = Instant::now();
        computed += t - got;
        if step % 100 == 0 {
            println!("step {step:>5}  loss {l:.4}");
        }
        step += 1;
    }
    let total = waited + computed;
    println!(
        "{step} steps on {device:?}{}: {:.1} ms/step, waiting for data {:.1}% ({:.3} ms/step), computing {:.1}%",
        if resident { " (resident)" } else { "" },
        total.as_secs_f64() * 1e3 / step.max(1) as f64,
        100.0 * waited.as_secs_f64() / total.as_secs_f64(),
        waited.as_secs_f64() * 1e3 / step.max(1) as f64,
        100.0 * computed.as_secs_f64() / total.as_secs_f64()
    );
    Ok(())
}
