//! Build script: only does something with the `torch` feature.
//!
//! The linker drops `libtorch_cuda.so` by default (`--as-needed`: no symbol of it is referenced
//! directly), and without it libtorch reports "Cannot initialize CUDA without ATen_cuda library"
//! on a GPU machine. When the libtorch torch-sys found has CUDA, link it explicitly. Also record
//! libtorch's directory as an rpath, so binaries built here run without `LD_LIBRARY_PATH` (on
//! another machine, point `LD_LIBRARY_PATH` at its `torch/lib`).

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if std::env::var_os("CARGO_FEATURE_TORCH").is_none() {
        return;
    }
    let Some(lib) = std::env::var_os("DEP_TCH_LIBTORCH_LIB") else {
        println!("cargo:warning=torch-sys did not say where libtorch is; no rpath set");
        return;
    };
    let lib = std::path::PathBuf::from(lib);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}
