//! Can the CUDA driver and NVRTC be loaded at all? Asked before any `cudarc` call.
//!
//! `cudarc` (feature `dynamic-loading`) panics when it cannot `dlopen` a library or
//! resolve a symbol. This module owns the cheap check that comes first: try the same
//! library names `cudarc` will try ([`cudarc::get_lib_name_candidates`]) with
//! `dlopen(RTLD_LAZY | RTLD_LOCAL)`, and report which were searched when none loads.
//! It does not create contexts or compile anything (see `gpu.rs`).

use std::ffi::CString;

use cudarc::driver::DriverError;

/// Libraries the GPU compactor needs, by `cudarc`'s base name.
const REQUIRED: [&str; 2] = ["cuda", "nvrtc"];

/// `Ok` when every required library can be loaded; otherwise which one failed and the
/// names searched.
pub(crate) fn probe_libraries() -> Result<(), String> {
    REQUIRED.into_iter().try_for_each(probe_library)
}

/// `Ok` when one of `cudarc`'s candidate names for `lib` (`"cuda"`, `"nvrtc"`) loads.
pub(crate) fn probe_library(lib: &str) -> Result<(), String> {
    let mut names = cudarc::get_lib_name_candidates(lib);
    if names.iter().any(|name| can_dlopen(name)) {
        return Ok(());
    }
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    let what = if lib == "nvrtc" {
        "CUDA NVRTC (libnvrtc, from a CUDA toolkit or the nvidia-cuda-nvrtc wheel)"
    } else {
        "the NVIDIA driver (libcuda)"
    };
    Err(format!(
        "cannot load lib{lib} (searched {}); is {what} installed and on the loader path?",
        names.join(", ")
    ))
}

/// Whether `name` can be `dlopen`ed right now. Closes it again: `cudarc` keeps its own
/// handle, and the loader's reference count keeps the library mapped meanwhile.
fn can_dlopen(name: &str) -> bool {
    let Ok(cname) = CString::new(name) else {
        return false;
    };
    // SAFETY: `cname` is a valid NUL-terminated string that outlives the call; dlopen
    // has no other preconditions. RTLD_LAZY defers symbol binding so a library with
    // missing optional symbols still opens; RTLD_LOCAL keeps its symbols out of the
    // global namespace.
    let handle = unsafe { libc::dlopen(cname.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return false;
    }
    // SAFETY: `handle` was returned non-null by dlopen above and is closed exactly once.
    unsafe { libc::dlclose(handle) };
    true
}

/// The error code's name (e.g. `CUDA_ERROR_OUT_OF_MEMORY`). Never use `DriverError`'s
/// own `Display`/`Debug`: they call `cuGetErrorString`, which panics when the loaded
/// libcuda lacks it (a stub or broken driver).
pub(crate) fn driver_error_text(e: &DriverError) -> String {
    format!("{:?}", e.0)
}
