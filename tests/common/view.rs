//! Views with no mount, for tests that call the view's API as the FUSE adapter would.

use std::path::Path;
use std::sync::Arc;

use shardfs::compact::CpuCompactor;
use shardfs::store::{LocalStore, Store};
use shardfs::view::write_api::{WriteConfig, Writer};
use shardfs::view::{View, ViewConfig, ViewFormat};

/// A writable view of `store` in `format`: a 1 MiB write buffer, the CPU compactor.
pub fn writable_view(store: Arc<dyn Store>, format: ViewFormat) -> View {
    let writer = Writer::new(WriteConfig {
        write_buffer: 1 << 20,
        chunks_per_shard: None,
        shard_target_bytes: 64 << 20,
        compactor: Arc::new(CpuCompactor::new()),
    });
    let config = ViewConfig {
        format,
        ..ViewConfig::default()
    };
    View::with_writer(store, config, Some(writer)).unwrap()
}

/// [`writable_view`] of the local store at `dir`.
pub fn writable_view_of(dir: &Path, format: ViewFormat) -> View {
    writable_view(Arc::new(LocalStore::open(dir).unwrap()), format)
}
