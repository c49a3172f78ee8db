//! Build script: only does something with the `torch` feature.
//!
//! Records libtorch's directory as an rpath, so binaries built here run without
//! `LD_LIBRARY_PATH` (on another machine, point `LD_LIBRARY_PATH` at its `torch/lib`), and from
//! there `trajstore::torch::load_cuda` opens `libtorch_cuda.so` when a CUDA device is first asked
//! for. It is deliberately not linked: `--as-needed` would drop it anyway (no symbol of it is
//! referenced), and linking it with `--no-as-needed` made every run, CPU runs too, load the CUDA
//! libraries and the driver (`libcublasLt` opens `libcuda` as it loads), at 0.3 s a start.
//!
//! Also compiles the CUDA kernels for the CPU: the resident mode's gather
//! (`src/torch/resident_host.cc` includes `resident_gather.cu`) and the frame decoder
//! (`src/torch/frames_host.cc` includes `frame_decode.cu`); NVRTC compiles both for a GPU at run
//! time. `src/torch/grid_sim.cc` runs the gather with a GPU's launch geometry for the tests.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo::rustc-check-cfg=cfg(trajstore_no_use_count)");
    if std::env::var_os("CARGO_FEATURE_TORCH").is_none() {
        return;
    }
    host_kernel();
    let Some(lib) = std::env::var_os("DEP_TCH_LIBTORCH_LIB") else {
        println!("cargo:warning=torch-sys did not say where libtorch is; no rpath set");
        println!("cargo:rustc-cfg=trajstore_no_use_count");
        return;
    };
    let lib = std::path::PathBuf::from(lib);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    use_count(&lib);
}

/// The device ring's reference counts (`src/torch/use_count.cc`), compiled against the headers
/// of the libtorch torch-sys links (`lib/../include`). Where they are missing the ring is left
/// out (`trajstore_no_use_count`): every batch then gets a new device buffer, as before it.
#[cfg(feature = "torch")]
fn use_count(lib: &std::path::Path) {
    println!("cargo:rerun-if-changed=src/torch/use_count.cc");
    let include = lib.join("..").join("include");
    if !include
        .join("ATen")
        .join("core")
        .join("TensorBody.h")
        .exists()
    {
        println!(
            "cargo:warning=no libtorch headers under {}: the device ring is off",
            include.display()
        );
        println!("cargo:rustc-cfg=trajstore_no_use_count");
        return;
    }
    cc::Build::new()
        .cpp(true)
        .file("src/torch/use_count.cc")
        .std("c++17")
        .include(&include)
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .warnings(false)
        .compile("trajstore_use_count");
}

#[cfg(not(feature = "torch"))]
fn use_count(_: &std::path::Path) {}

/// The kernels as C++ for the CPU (`torch::kernel`, `torch::frame_decode`).
#[cfg(feature = "torch")]
fn host_kernel() {
    for f in [
        "resident_gather.cu",
        "resident_host.cc",
        "frame_decode.cu",
        "frames_host.cc",
        "expand.cu",
        "expand_host.cc",
        "cuda_host.h",
        "grid_sim.cc",
    ] {
        println!("cargo:rerun-if-changed=src/torch/{f}");
    }
    cc::Build::new()
        .cpp(true)
        .file("src/torch/resident_host.cc")
        .file("src/torch/frames_host.cc")
        .file("src/torch/expand_host.cc")
        .file("src/torch/grid_sim.cc")
        .std("c++20")
        .include("src/torch")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("trajstore_resident_host");
}

#[cfg(not(feature = "torch"))]
fn host_kernel() {}
