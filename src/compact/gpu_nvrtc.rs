//! Run-time compilation and loading of `gpu_kernel.cu` with NVRTC.
//!
//! Owns the choice of binary: first SASS (a cubin) for the device's real architecture,
//! because a cubin from any NVRTC of the driver's major version loads, whereas PTX from
//! an NVRTC newer than the driver fails to JIT (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`);
//! then PTX for the device's virtual architecture; then PTX for NVRTC's default. The
//! first that compiles and loads wins; if none does, every attempt's error is reported.

use std::ffi::{CStr, CString, c_char};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts, result, sys};

use super::gpu_probe::driver_error_text;

/// The kernels' source, compiled at run time.
const KERNEL_SOURCE: &str = include_str!("gpu_kernel.cu");
const PROGRAM_NAME: &str = "shardfs_compact.cu";

/// The three aggregate-by-shard kernels, loaded into one context.
pub(crate) struct Kernels {
    pub(crate) permute: CudaFunction,
    pub(crate) scan: CudaFunction,
    pub(crate) gather: CudaFunction,
}

/// PTX for virtual architecture `arch` (e.g. `compute_90`; `None`: NVRTC's default).
pub(crate) fn compile_ptx(arch: Option<&str>) -> Result<Ptx, String> {
    let opts = CompileOptions {
        name: Some(PROGRAM_NAME.to_owned()),
        options: arch
            .map(|a| format!("--gpu-architecture={a}"))
            .into_iter()
            .collect(),
        ..Default::default()
    };
    compile_ptx_with_opts(KERNEL_SOURCE, opts).map_err(|e| format!("NVRTC PTX: {e}"))
}

/// Destroys an NVRTC program on every exit path.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `create_program` and is destroyed only here, once.
        if let Err(e) = unsafe { result::destroy_program(self.0) } {
            log::debug!("nvrtcDestroyProgram: {e}");
        }
    }
}

/// A cubin (SASS) for real architecture `sm` (e.g. `sm_90`).
pub(crate) fn compile_cubin(sm: &str) -> Result<Vec<u8>, String> {
    let src = CString::new(KERNEL_SOURCE).map_err(|e| format!("kernel source: {e}"))?;
    let name = CString::new(PROGRAM_NAME).map_err(|e| format!("program name: {e}"))?;
    let program = Program(
        result::create_program(&src, Some(&name)).map_err(|e| format!("NVRTC create: {e}"))?,
    );
    let options = [format!("--gpu-architecture={sm}")];
    // SAFETY: `program.0` is a live program (destroyed only by `Program::drop`), and
    // `src`/`name`, which it may reference, outlive it (declared before it).
    if let Err(e) = unsafe { result::compile_program(program.0, &options) } {
        // SAFETY: as above; the log is a NUL-terminated string NVRTC wrote.
        let log = unsafe { result::get_program_log(program.0) }
            .map(|raw| {
                // SAFETY: `raw` is NUL-terminated (NVRTC's log size includes the NUL).
                unsafe { CStr::from_ptr(raw.as_ptr()) }
                    .to_string_lossy()
                    .into_owned()
            })
            .unwrap_or_default();
        return Err(format!("NVRTC cubin for {sm}: {e}: {log}"));
    }
    let mut size = 0usize;
    // SAFETY: `program.0` is live and compiled; `size` is a valid out-pointer.
    unsafe { sys::nvrtcGetCUBINSize(program.0, &mut size) }
        .result()
        .map_err(|e| format!("NVRTC cubin size: {e}"))?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has exactly the `size` bytes NVRTC asked for.
    unsafe { sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast::<c_char>()) }
        .result()
        .map_err(|e| format!("NVRTC cubin: {e}"))?;
    Ok(cubin)
}

/// The kinds of binary tried, in order.
#[derive(Clone, Copy)]
enum Binary {
    Cubin,
    DevicePtx,
    DefaultPtx,
}

impl Binary {
    fn name(self) -> &'static str {
        match self {
            Self::Cubin => "cubin",
            Self::DevicePtx => "PTX",
            Self::DefaultPtx => "PTX for the default arch",
        }
    }

    fn compile(self, sm: &str, compute: &str) -> Result<Ptx, String> {
        match self {
            Self::Cubin => compile_cubin(sm).map(Ptx::from_binary),
            Self::DevicePtx => compile_ptx(Some(compute)),
            Self::DefaultPtx => compile_ptx(None),
        }
    }
}

/// Compiles and loads the kernels into `ctx` (see the module header for the order).
pub(crate) fn load_kernels(ctx: &Arc<CudaContext>) -> Result<Kernels, String> {
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| format!("cannot query compute capability: {}", driver_error_text(&e)))?;
    let sm = format!("sm_{major}{minor}");
    let compute = format!("compute_{major}{minor}");
    let attempts = [Binary::Cubin, Binary::DevicePtx, Binary::DefaultPtx];
    let mut errors = Vec::new();
    for binary in attempts {
        let what = binary.name();
        let loaded = binary.compile(&sm, &compute).and_then(|image| {
            ctx.load_module(image)
                .map_err(|e| format!("loading the {what}: {}", driver_error_text(&e)))
        });
        let module = match loaded {
            Ok(module) => module,
            Err(e) => {
                log::debug!("compaction kernels as {what}: {e}");
                errors.push(e);
                continue;
            }
        };
        let function = |name: &str| {
            module.load_function(name).map_err(|e| {
                let e = driver_error_text(&e);
                format!("kernel {name} missing from the {what}: {e}")
            })
        };
        return Ok(Kernels {
            permute: function("permute_sizes")?,
            scan: function("exclusive_scan")?,
            gather: function("gather_chunks")?,
        });
    }
    Err(format!(
        "cannot build the compaction kernels: {}",
        errors.join("; ")
    ))
}
