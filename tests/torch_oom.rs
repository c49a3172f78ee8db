//! GPU-resident mode when the device's memory is taken: a clear, short error, and the process
//! goes on. Its own test binary (its own process): the test fills the device, and what
//! libtorch's caching allocator then holds would starve other tests' kernels of memory.
#![cfg(feature = "torch")]

mod common;

use common::TestData;
use tch::{Device, Kind, Tensor};
use trajstore::torch::{FloatCast, TorchLoader, TorchLoaderOptions, resident_bytes};
use trajstore::{BatchSource, BoundaryPolicy, Gatherer, LoaderOptions, LoaderSpec, SamplerSpec};

#[test]
fn cuda_resident_beyond_free_device_memory_is_an_error_not_a_crash() {
    let dev = if trajstore::torch::cuda_available() {
        Device::Cuda(0)
    } else if std::env::var_os("TRAJSTORE_REQUIRE_CUDA").is_some() {
        panic!("TRAJSTORE_REQUIRE_CUDA is set but libtorch sees no CUDA device");
    } else {
        common::skipped("no CUDA device");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let snap = TestData::new()
        .transitions(300_000)
        .obs_dim(64)
        .mean_episode_len(200.0)
        .snapshot(&dir.path().join("d"));
    let cols = ["observation", "reward"];
    let g = Gatherer::try_new(&snap, &cols).unwrap();
    let need = resident_bytes(&g, FloatCast::None).unwrap();
    assert!(
        need > 64 << 20,
        "the dataset must outgrow the memory left: {need}"
    );
    let sampler = SamplerSpec::uniform(16, 24).with_policy(BoundaryPolicy::Pad);
    let s = BatchSource::open(LoaderSpec::single(snap.clone(), sampler, &cols)).unwrap();
    let opts = TorchLoaderOptions::new(dev)
        .with_loader(LoaderOptions::default().with_max_batches(2))
        .with_resident(u64::MAX);
    // Once with the memory free: libtorch loads the kernels it needs (CUDA loads modules
    // lazily, into device memory), so that the retry below measures the loader, not that.
    let mut l = TorchLoader::new(&s, opts.clone()).unwrap();
    assert!(l.next_batch().unwrap().is_ok());
    drop(l);
    // Take the device's memory until less than 64 MiB is left.
    let mut hog = Vec::new();
    for size in [1i64 << 30, 256 << 20, 64 << 20] {
        while let Ok(t) = Tensor::f_empty([size], (Kind::Uint8, dev)) {
            hog.push(t);
        }
    }
    assert!(!hog.is_empty());
    let e = match TorchLoader::new(&s, opts.clone()) {
        Ok(_) => panic!("a resident upload of {need} bytes fit in less than 64 MiB"),
        Err(e) => e,
    };
    let msg = e.to_string();
    assert!(msg.contains("resident"), "{msg}");
    assert!(msg.to_lowercase().contains("out of memory"), "{msg}");
    assert!(msg.lines().count() <= 3, "a short error, not a dump: {msg}");
    // The process is fine: with the memory back, the same loader uploads and samples.
    drop(hog);
    let mut l = TorchLoader::new(&s, opts).unwrap();
    assert!(l.next_batch().unwrap().is_ok());
}
