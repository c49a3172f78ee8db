//! A CPU run of the torch loader makes no CUDA call: its own test binary (so no other test's
//! device query shares the process), checking that the CUDA driver library was never loaded,
//! which any CUDA call (a device query, a context, an allocation, pinning) would do. On a GPU
//! machine this is what proves a `--device cpu` run leaves the GPU alone; on a machine without
//! a driver it holds trivially.
#![cfg(feature = "torch")]

mod common;

use common::TestData;
use tch::Device;
use trajstore::torch::{TorchLoader, TorchLoaderOptions, parse_device};
use trajstore::{BatchSource, BoundaryPolicy, LoaderOptions, LoaderSpec, SamplerSpec};

#[test]
fn a_cpu_run_never_loads_the_cuda_driver() {
    let dir = tempfile::tempdir().unwrap();
    let snap = TestData::new()
        .transitions(20_000)
        .obs_dim(4)
        .mean_episode_len(50.0)
        .snapshot(&dir.path().join("d"));
    let device = parse_device("cpu").unwrap();
    let sampler = SamplerSpec::uniform(8, 32).with_policy(BoundaryPolicy::Pad);
    let cols = ["observation", "action", "reward", "next_observation"];
    let source = BatchSource::open(LoaderSpec::single(snap, sampler, &cols)).unwrap();
    for resident in [false, true] {
        let mut opts = TorchLoaderOptions::new(device).with_loader(
            LoaderOptions::default()
                .with_workers(2)
                .with_max_batches(20),
        );
        if resident {
            opts = opts.with_resident(1 << 30);
        }
        let mut n = 0;
        for t in TorchLoader::new(&source, opts).unwrap() {
            assert_eq!(t.unwrap().device(), Device::Cpu);
            n += 1;
        }
        assert_eq!(n, 20);
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(
        !maps.contains("libcuda.so"),
        "a CPU run loaded the CUDA driver"
    );
    // Nor libtorch's CUDA half (whose libraries open the driver as they load): checkable on any
    // machine, GPU or not.
    assert!(
        !maps.contains("libtorch_cuda.so"),
        "a CPU run loaded libtorch_cuda"
    );
}
