//! [`ObjectStoreStore`]: a store in object storage (`s3://bucket/prefix`), through the
//! `object_store` crate (its S3 client signs and retries; its in-memory store serves unit
//! tests).
//!
//! - **Names**: the store path `a/b/c` is the object `prefix/a/b/c`. Directories are
//!   the common prefixes of object keys; one made by `mkdir` exists in this process only
//!   until an object lands below it (as mountpoint-s3 does).
//! - **Reads** are ranged GETs, each conditional on the ETag the file was opened with,
//!   so a read never mixes two versions of an object (`ESTALE` when it changed).
//! - **Shard commits** read the whole shard and its ETag, let the caller's merge decide
//!   (last close wins), write the new shard densely and PUT it with `If-Match` (a new
//!   shard with `If-None-Match: *`). When another writer got there first (412), the
//!   commit reads, merges and tries again, with backoff. A shard whose chunks are all
//!   deleted is kept as an index-only object, with the deletions' close times, since a
//!   DELETE cannot be made conditional here.
//! - **Other files** (metadata, a writer's temporary files) are held in memory while
//!   open for writing and PUT whole at `fsync` and when the last handle goes; `rename`
//!   is a copy and a delete (not atomic, as on any object store).
//!
//! Every call blocks its (FUSE) thread on a runtime of this store's own.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use object_store::path::Path as ObjPath;
use object_store::{
    GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    UpdateVersion,
};
use parking_lot::Mutex;

use super::commit::{CommitError, CommitOutcome, Merge};
use super::memory::{dense_shard, rewrite_shard};
use super::{EntryKind, EntryMeta, ListEntry, OpenMode, SpaceInfo, Store, StoreFile, StoreFileRw};
use crate::format::ShardLevel;

/// How often a shard commit tries again when another writer changed the shard first.
const COMMIT_ATTEMPTS: u32 = 12;

/// How long one request may keep failing (an unreachable endpoint, 5xx answers), its
/// retries included, before the operation fails with EIO, unless told otherwise
/// (`--s3-timeout`). A connection attempt itself gives up after 5 s and a request after
/// 30 s (object_store's defaults).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A store in object storage.
pub struct ObjectStoreStore {
    url: String,
    inner: Arc<dyn ObjectStore>,
    prefix: ObjPath,
    rt: tokio::runtime::Runtime,
    /// Directories made by `mkdir` that hold no object yet.
    dirs: Mutex<BTreeSet<PathBuf>>,
    /// Files open for writing: `stat` shows their length as written so far.
    open_rw: Mutex<HashMap<PathBuf, Weak<RwState>>>,
}

/// Why an object store could not be opened, said for the person who typed the URL.
#[derive(Debug, thiserror::Error)]
#[error("{url}: {why}")]
pub struct OpenError {
    pub url: String,
    pub why: String,
}

impl ObjectStoreStore {
    /// The store at `url` (`s3://BUCKET[/PREFIX]`), configured from the environment as
    /// the AWS CLI is (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
    /// `AWS_REGION`/`AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`), and
    /// checked: the bucket must answer a listing of the prefix. A request that keeps
    /// failing is retried, with backoff, for up to `timeout`.
    pub fn open_url(url: &str, timeout: Duration) -> Result<Self, OpenError> {
        let err = |why: String| OpenError {
            url: url.to_string(),
            why,
        };
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| err("only s3:// URLs are supported".into()))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(err("no bucket named (s3://BUCKET/PREFIX)".into()));
        }
        // object_store panics on an endpoint that is not an absolute URL: say so first.
        for var in ["AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3"] {
            if let Ok(v) = std::env::var(var)
                && !(v.starts_with("http://") || v.starts_with("https://"))
            {
                return Err(err(format!(
                    "{var}={v:?} is not an http:// or https:// URL"
                )));
            }
        }
        let mut builder = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_retry(object_store::RetryConfig {
                backoff: object_store::BackoffConfig::default(),
                max_retries: 10,
                retry_timeout: timeout,
            });
        if std::env::var_os("AWS_REGION").is_none()
            && let Ok(region) = std::env::var("AWS_DEFAULT_REGION")
        {
            builder = builder.with_region(region);
        }
        let s3 = builder.build().map_err(|e| err(e.to_string()))?;
        let store = Self::new(Arc::new(s3), prefix, url).map_err(|e| err(e.to_string()))?;
        store.check().map_err(err)?;
        Ok(store)
    }

    /// A store over `inner` (any object store: the in-memory one in tests) below `prefix`.
    pub fn new(inner: Arc<dyn ObjectStore>, prefix: &str, url: &str) -> io::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("shardfs-s3")
            .enable_all()
            .build()?;
        Ok(ObjectStoreStore {
            url: url.to_string(),
            inner,
            prefix: ObjPath::from_iter(prefix.split('/').filter(|p| !p.is_empty())),
            rt,
            dirs: Mutex::new(BTreeSet::new()),
            open_rw: Mutex::new(HashMap::new()),
        })
    }

    /// One listing of the prefix, so that a wrong bucket, wrong credentials or an
    /// unreachable endpoint are said at mount, not as EIO later.
    fn check(&self) -> Result<(), String> {
        let listing = self
            .rt
            .block_on(self.inner.list_with_delimiter(Some(&self.prefix)));
        match listing {
            Ok(_) => Ok(()),
            Err(e) => Err(describe_error(&e)),
        }
    }

    fn key(&self, rel: &Path) -> io::Result<ObjPath> {
        let mut key = self.prefix.clone();
        for c in rel.components() {
            match c {
                Component::Normal(part) => {
                    let part = part.to_str().ok_or_else(|| {
                        io::Error::new(io::ErrorKind::InvalidInput, "a name that is not UTF-8")
                    })?;
                    key = key.join(part);
                }
                Component::CurDir => {}
                _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
            }
        }
        Ok(key)
    }

    fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    fn head(&self, rel: &Path) -> io::Result<Option<object_store::ObjectMeta>> {
        if rel.as_os_str().is_empty() {
            return Ok(None);
        }
        match self.block_on(self.inner.head(&self.key(rel)?)) {
            Ok(m) => Ok(Some(m)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(to_io(rel, e)),
        }
    }

    /// Whether any object lies below `rel`.
    fn has_children(&self, rel: &Path) -> io::Result<bool> {
        let key = self.key(rel)?;
        let l = self
            .block_on(self.inner.list_with_delimiter(Some(&key)))
            .map_err(|e| to_io(rel, e))?;
        Ok(!l.objects.is_empty() || !l.common_prefixes.is_empty())
    }

    fn put(&self, rel: &Path, data: Vec<u8>, mode: PutMode) -> io::Result<()> {
        let key = self.key(rel)?;
        let opts = PutOptions {
            mode,
            ..Default::default()
        };
        self.block_on(self.inner.put_opts(&key, PutPayload::from(data), opts))
            .map_err(|e| to_io(rel, e))?;
        let mut dirs = self.dirs.lock();
        for d in rel.ancestors().skip(1) {
            dirs.remove(d);
        }
        Ok(())
    }

    /// The whole object and its version; `None` when there is none.
    fn get_versioned(&self, rel: &Path) -> io::Result<Option<(Vec<u8>, UpdateVersion)>> {
        let key = self.key(rel)?;
        match self.block_on(async {
            let r = self.inner.get(&key).await?;
            let version = UpdateVersion {
                e_tag: r.meta.e_tag.clone(),
                version: r.meta.version.clone(),
            };
            Ok::<_, object_store::Error>((r.bytes().await?.to_vec(), version))
        }) {
            Ok(v) => Ok(Some(v)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(to_io(rel, e)),
        }
    }
}

impl std::fmt::Debug for ObjectStoreStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectStoreStore({})", self.url)
    }
}

/// A person's words for an object store failure at mount.
fn describe_error(e: &object_store::Error) -> String {
    // The first line: the rest is the server's XML.
    let full = e.to_string();
    let text = full
        .lines()
        .next()
        .unwrap_or_default()
        .trim_end_matches(": ")
        .to_string();
    let lower = text.to_lowercase();
    match e {
        object_store::Error::NotFound { .. } => format!("no such bucket ({text})"),
        object_store::Error::PermissionDenied { .. } => format!("access denied (403): {text}"),
        object_store::Error::Unauthenticated { .. } => {
            format!("the credentials were refused: {text}")
        }
        _ if full.contains("NoSuchBucket") || lower.contains("bucket does not exist") => {
            format!("no such bucket ({text})")
        }
        _ if lower.contains("accessdenied") || lower.contains("403") => {
            format!("access denied (403): {text}")
        }
        _ if lower.contains("connect")
            || lower.contains("error sending request")
            || lower.contains("dns")
            || lower.contains("timed out") =>
        {
            format!("cannot reach the endpoint: {text}")
        }
        _ if lower.contains("credential") => format!("no usable credentials: {text}"),
        _ => text,
    }
}

/// An object store error as an errno, logged with its words (FUSE carries only the
/// errno).
fn to_io(rel: &Path, e: object_store::Error) -> io::Error {
    let errno = match &e {
        object_store::Error::NotFound { .. } => libc::ENOENT,
        object_store::Error::AlreadyExists { .. } => libc::EEXIST,
        object_store::Error::Precondition { .. } => libc::ESTALE,
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => libc::EACCES,
        object_store::Error::NotSupported { .. } | object_store::Error::NotImplemented { .. } => {
            libc::ENOTSUP
        }
        _ => libc::EIO,
    };
    if errno != libc::ENOENT {
        log::warn!("{}: {}", rel.display(), describe_error(&e));
    }
    io::Error::from_raw_os_error(errno)
}

fn meta_of(m: &object_store::ObjectMeta) -> EntryMeta {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    m.e_tag.hash(&mut h);
    m.version.hash(&mut h);
    let mtime = SystemTime::UNIX_EPOCH
        + Duration::from_millis(u64::try_from(m.last_modified.timestamp_millis()).unwrap_or(0));
    EntryMeta {
        kind: EntryKind::File,
        len: m.size,
        mtime,
        ctime: mtime,
        perm: 0o644,
        uid: 0,
        gid: 0,
        // The ETag: with the length and time, tells when an object was replaced.
        ino: h.finish() >> 1,
    }
}

fn dir_meta() -> EntryMeta {
    EntryMeta {
        kind: EntryKind::Dir,
        len: 0,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        perm: 0o755,
        uid: 0,
        gid: 0,
        ino: 1,
    }
}

/// An object open for reading: ranged GETs of the version it was opened at.
struct ObjectFile {
    store: Arc<dyn ObjectStore>,
    handle: tokio::runtime::Handle,
    key: ObjPath,
    meta: object_store::ObjectMeta,
}

impl StoreFile for ObjectFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let size = self.meta.size;
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let end = size.min(offset + buf.len() as u64);
        let opts = GetOptions {
            range: Some(GetRange::Bounded(offset..end)),
            if_match: self.meta.e_tag.clone(),
            ..Default::default()
        };
        let bytes = self
            .handle
            .block_on(async { self.store.get_opts(&self.key, opts).await?.bytes().await })
            .map_err(|e| to_io(Path::new(self.key.as_ref()), e))?;
        let n = bytes.len().min(buf.len());
        buf[..n].copy_from_slice(&bytes[..n]);
        Ok(n)
    }

    fn meta(&self) -> io::Result<EntryMeta> {
        Ok(meta_of(&self.meta))
    }
}

/// A file open for writing: its bytes in memory, PUT whole when synced or closed.
struct RwState {
    data: Mutex<(Vec<u8>, bool)>,
}

struct ObjectFileRw {
    store: Arc<ObjectStoreStoreRef>,
    rel: PathBuf,
    state: Arc<RwState>,
}

/// What an open-for-writing file needs of its store: PUT and the runtime.
struct ObjectStoreStoreRef {
    inner: Arc<dyn ObjectStore>,
    key: ObjPath,
    handle: tokio::runtime::Handle,
}

impl ObjectFileRw {
    fn flush(&self) -> io::Result<()> {
        let mut d = self.state.data.lock();
        if !d.1 {
            return Ok(());
        }
        let store = &self.store;
        let payload = PutPayload::from(d.0.clone());
        store
            .handle
            .block_on(store.inner.put(&store.key, payload))
            .map_err(|e| to_io(&self.rel, e))?;
        d.1 = false;
        Ok(())
    }
}

impl StoreFile for ObjectFileRw {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let d = self.state.data.lock();
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(d.0.len());
        let n = buf.len().min(d.0.len() - start);
        buf[..n].copy_from_slice(&d.0[start..start + n]);
        Ok(n)
    }

    fn meta(&self) -> io::Result<EntryMeta> {
        let mut m = dir_meta();
        m.kind = EntryKind::File;
        m.perm = 0o644;
        m.len = self.state.data.lock().0.len() as u64;
        Ok(m)
    }
}

impl StoreFileRw for ObjectFileRw {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut d = self.state.data.lock();
        let at = usize::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        let end = at
            .checked_add(buf.len())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFBIG))?;
        if d.0.len() < end {
            d.0.resize(end, 0);
        }
        d.0[at..end].copy_from_slice(buf);
        d.1 = true;
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        let mut d = self.state.data.lock();
        d.0.resize(len, 0);
        d.1 = true;
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.flush()
    }
}

impl Drop for ObjectFileRw {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            log::error!("{}: not stored at close: {e}", self.rel.display());
        }
    }
}

impl Store for ObjectStoreStore {
    fn stat(&self, rel: &Path) -> io::Result<Option<EntryMeta>> {
        if rel.as_os_str().is_empty() {
            return Ok(Some(dir_meta()));
        }
        if let Some(state) = self.open_rw.lock().get(rel).and_then(Weak::upgrade) {
            let mut m = dir_meta();
            m.kind = EntryKind::File;
            m.perm = 0o644;
            m.len = state.data.lock().0.len() as u64;
            return Ok(Some(m));
        }
        if let Some(m) = self.head(rel)? {
            return Ok(Some(meta_of(&m)));
        }
        if self.dirs.lock().contains(rel) || self.has_children(rel)? {
            return Ok(Some(dir_meta()));
        }
        Ok(None)
    }

    fn list(&self, rel: &Path) -> io::Result<Vec<ListEntry>> {
        let key = self.key(rel)?;
        let l = self
            .block_on(self.inner.list_with_delimiter(Some(&key)))
            .map_err(|e| to_io(rel, e))?;
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        for p in &l.common_prefixes {
            if let Some(name) = p.filename()
                && seen.insert(name.to_string())
            {
                out.push(ListEntry {
                    name: OsString::from(name),
                    kind: EntryKind::Dir,
                });
            }
        }
        for o in &l.objects {
            if let Some(name) = o.location.filename()
                && o.location != key
                && seen.insert(name.to_string())
            {
                out.push(ListEntry {
                    name: OsString::from(name),
                    kind: EntryKind::File,
                });
            }
        }
        for d in self.dirs.lock().iter() {
            if d.parent() == Some(rel)
                && let Some(name) = d.file_name()
                && seen.insert(name.to_string_lossy().into_owned())
            {
                out.push(ListEntry {
                    name: name.to_os_string(),
                    kind: EntryKind::Dir,
                });
            }
        }
        if out.is_empty() && !rel.as_os_str().is_empty() && self.stat(rel)?.is_none() {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        Ok(out)
    }

    fn open(&self, rel: &Path) -> io::Result<Option<Box<dyn StoreFile>>> {
        let Some(meta) = self.head(rel)? else {
            return Ok(None);
        };
        Ok(Some(Box::new(ObjectFile {
            store: self.inner.clone(),
            handle: self.rt.handle().clone(),
            key: self.key(rel)?,
            meta,
        })))
    }

    fn read_link(&self, _rel: &Path) -> io::Result<PathBuf> {
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    }

    fn space(&self) -> io::Result<SpaceInfo> {
        // Object storage has no size: say "plenty", as mountpoint-s3 does.
        Ok(SpaceInfo {
            blocks: u64::MAX / 4096 / 2,
            bfree: u64::MAX / 4096 / 2,
            bavail: u64::MAX / 4096 / 2,
            files: u64::MAX / 2,
            ffree: u64::MAX / 2,
            bsize: 4096,
            namelen: 1024,
        })
    }

    fn describe(&self) -> String {
        self.url.clone()
    }

    fn read_all(&self, rel: &Path) -> io::Result<Option<Vec<u8>>> {
        if let Some(state) = self.open_rw.lock().get(rel).and_then(Weak::upgrade) {
            return Ok(Some(state.data.lock().0.clone()));
        }
        Ok(self.get_versioned(rel)?.map(|(b, _)| b))
    }

    fn commit_shard(
        &self,
        rel: &Path,
        level: &ShardLevel,
        merge: &mut Merge<'_, '_>,
    ) -> Result<CommitOutcome, CommitError> {
        let io_err = |e: io::Error| CommitError::Io {
            path: rel.to_path_buf(),
            source: e,
        };
        let mut backoff = Duration::from_millis(10);
        for attempt in 1..=COMMIT_ATTEMPTS {
            let current = self.get_versioned(rel).map_err(io_err)?;
            let rewrite = rewrite_shard(rel, level, current.as_ref().map(|(b, _)| &b[..]), merge)?;
            let Some(mut bytes) = rewrite.bytes else {
                return Ok(rewrite.outcome);
            };
            let mut outcome = rewrite.outcome;
            if outcome.removed {
                if current.is_none() {
                    return Ok(outcome);
                }
                // No conditional DELETE: an index-only shard that keeps the deletions'
                // close times, so that an older write from another mount cannot win.
                let n = rewrite.times.as_slice().len();
                bytes = dense_shard(level, &vec![None; n], &rewrite.times);
                outcome.removed = false;
                outcome.rewritten = true;
                outcome.new_len = bytes.len() as u64;
                outcome.bytes_written = outcome.new_len;
            }
            let mode = match current {
                None => PutMode::Create,
                Some((_, version)) => PutMode::Update(version),
            };
            match self.put(rel, bytes, mode) {
                Ok(()) => return Ok(outcome),
                Err(e)
                    if matches!(e.raw_os_error(), Some(libc::EEXIST | libc::ESTALE))
                        && attempt < COMMIT_ATTEMPTS =>
                {
                    log::debug!(
                        "{}: changed by another writer; merging again (attempt {attempt})",
                        rel.display()
                    );
                    std::thread::sleep(backoff + jitter(backoff));
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(io_err(e)),
            }
        }
        Err(io_err(io::Error::other(
            "the shard kept changing under this commit",
        )))
    }

    fn open_rw(
        &self,
        rel: &Path,
        mode: OpenMode,
        truncate: bool,
    ) -> io::Result<Box<dyn StoreFileRw>> {
        let existing = self.read_all(rel)?;
        let data = match (mode, existing) {
            (OpenMode::Existing, None) => return Err(io::Error::from_raw_os_error(libc::ENOENT)),
            (OpenMode::CreateNew, Some(_)) => {
                return Err(io::Error::from_raw_os_error(libc::EEXIST));
            }
            (_, None) => {
                // Made at once, so that the name exists for everyone from now on.
                let create = if mode == OpenMode::CreateNew {
                    PutMode::Create
                } else {
                    PutMode::Overwrite
                };
                self.put(rel, Vec::new(), create)?;
                Vec::new()
            }
            (_, Some(_)) if truncate => Vec::new(),
            (_, Some(bytes)) => bytes,
        };
        let state = Arc::new(RwState {
            data: Mutex::new((data, truncate)),
        });
        self.open_rw
            .lock()
            .insert(rel.to_path_buf(), Arc::downgrade(&state));
        Ok(Box::new(ObjectFileRw {
            store: Arc::new(ObjectStoreStoreRef {
                inner: self.inner.clone(),
                key: self.key(rel)?,
                handle: self.rt.handle().clone(),
            }),
            rel: rel.to_path_buf(),
            state,
        }))
    }

    fn write_atomically(&self, rel: &Path, data: &[u8]) -> io::Result<()> {
        self.put(rel, data.to_vec(), PutMode::Overwrite)
    }

    fn create_dir(&self, rel: &Path) -> io::Result<()> {
        if self.stat(rel)?.is_some() {
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        let parent = rel.parent().unwrap_or(Path::new(""));
        if !matches!(self.stat(parent)?, Some(m) if m.kind == EntryKind::Dir) {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        self.dirs.lock().insert(rel.to_path_buf());
        Ok(())
    }

    fn remove_file(&self, rel: &Path) -> io::Result<()> {
        if self.head(rel)?.is_none() {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        self.block_on(self.inner.delete(&self.key(rel)?))
            .map_err(|e| to_io(rel, e))
    }

    fn remove_dir(&self, rel: &Path) -> io::Result<()> {
        if self.has_children(rel)? {
            return Err(io::Error::from_raw_os_error(libc::ENOTEMPTY));
        }
        if !self.dirs.lock().remove(rel) && self.head(rel)?.is_some() {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let data = self
            .read_all(from)?
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        self.put(to, data, PutMode::Overwrite)?;
        self.remove_file(from)
    }

    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        let data = self
            .read_all(from)?
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        self.put(to, data, PutMode::Create)
    }
}

/// Up to a quarter of `d`, so that racing writers spread out.
fn jitter(d: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|t| t.subsec_nanos())
        .unwrap_or(0);
    d / 4 * (nanos % 1000) / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> ObjectStoreStore {
        let mem = Arc::new(object_store::memory::InMemory::new());
        ObjectStoreStore::new(mem, "pre/fix", "memory://test").unwrap()
    }

    #[test]
    fn files_and_directories_as_a_directory_tree() {
        let s = store();
        s.write_atomically(Path::new("a/b/zarr.json"), b"{}")
            .unwrap();
        s.write_atomically(Path::new("a/c"), b"12345").unwrap();
        assert_eq!(
            s.stat(Path::new("a")).unwrap().unwrap().kind,
            EntryKind::Dir
        );
        assert_eq!(s.stat(Path::new("a/c")).unwrap().unwrap().len, 5);
        assert!(s.stat(Path::new("nope")).unwrap().is_none());
        let mut names: Vec<_> = s
            .list(Path::new("a"))
            .unwrap()
            .into_iter()
            .map(|e| (e.name.into_string().unwrap(), e.kind))
            .collect();
        names.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(
            names,
            vec![("b".into(), EntryKind::Dir), ("c".into(), EntryKind::File)]
        );
        let f = s.open(Path::new("a/c")).unwrap().unwrap();
        let mut buf = [0; 3];
        f.read_exact_at(&mut buf, 1).unwrap();
        assert_eq!(&buf, b"234");
        // A version replaced under an open file is not mixed in.
        s.write_atomically(Path::new("a/c"), b"abcde").unwrap();
        let e = f.read_at(&mut buf, 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESTALE));
        // mkdir: a directory of this process until an object lands below it.
        s.create_dir(Path::new("a/new")).unwrap();
        assert_eq!(
            s.stat(Path::new("a/new")).unwrap().unwrap().kind,
            EntryKind::Dir
        );
        assert_eq!(
            s.create_dir(Path::new("a/new")).unwrap_err().raw_os_error(),
            Some(libc::EEXIST)
        );
        assert_eq!(
            s.remove_dir(Path::new("a/b")).unwrap_err().raw_os_error(),
            Some(libc::ENOTEMPTY)
        );
        s.remove_dir(Path::new("a/new")).unwrap();
        s.rename(Path::new("a/c"), Path::new("a/d")).unwrap();
        assert!(s.stat(Path::new("a/c")).unwrap().is_none());
        assert_eq!(s.read_all(Path::new("a/d")).unwrap().unwrap(), b"abcde");
    }

    fn level() -> ShardLevel {
        use crate::format::IndexLocation;
        use crate::format::index::{Endian, IndexCodecs};
        ShardLevel {
            chunk_shape: vec![4],
            chunks_per_shard: vec![4],
            index_codecs: IndexCodecs {
                endian: Endian::Little,
                crc32c: true,
            },
            index_location: IndexLocation::End,
        }
    }

    /// Another writer's PUT lands between this commit's read and its conditional PUT:
    /// the PUT is refused (412), the commit reads again, merges with what the other
    /// wrote, and stores both.
    #[test]
    fn a_commit_that_loses_the_race_reads_merges_and_tries_again() {
        use crate::store::commit::SlotChange;
        let mem = Arc::new(object_store::memory::InMemory::new());
        let s = ObjectStoreStore::new(mem.clone(), "", "memory://race").unwrap();
        let other = ObjectStoreStore::new(mem, "", "memory://race").unwrap();
        let rel = Path::new("a/c/0");
        let mine = [7u8; 4];
        let theirs = [9u8; 4];
        let mut calls = 0;
        let mut merge = |snap: &crate::store::ShardSnapshot<'_>| {
            calls += 1;
            if calls == 1 {
                // The other writer commits slot 2 now, after this commit read the shard.
                let mut theirs_merge = |_: &crate::store::ShardSnapshot<'_>| {
                    vec![SlotChange {
                        slot: 2,
                        data: Some(&theirs[..]),
                        closed: 5,
                    }]
                };
                other
                    .commit_shard(rel, &level(), &mut theirs_merge)
                    .unwrap();
            } else {
                assert!(
                    snap.index.entries()[2].is_some(),
                    "the second read sees theirs"
                );
            }
            vec![SlotChange {
                slot: 0,
                data: Some(&mine[..]),
                closed: 6,
            }]
        };
        s.commit_shard(rel, &level(), &mut merge).unwrap();
        assert_eq!(calls, 2, "one refused PUT, one that stood");
        let bytes = s.read_all(rel).unwrap().unwrap();
        let rewrite = rewrite_shard(rel, &level(), Some(&bytes), &mut |_| Vec::new()).unwrap();
        let entries = rewrite.outcome.index.entries().to_vec();
        let slot = |i: usize| {
            let r = entries[i].unwrap();
            bytes[r.offset as usize..r.end() as usize].to_vec()
        };
        assert_eq!(slot(0), mine);
        assert_eq!(slot(2), theirs);
        assert!(entries[1].is_none() && entries[3].is_none());
    }

    /// Deleting the last chunk of a shard keeps an index-only shard with the deletion's
    /// close time, so an older write (another mount's, flushed later) cannot bring the
    /// chunk back.
    #[test]
    fn an_emptied_shard_keeps_its_deletion_times() {
        use crate::store::commit::SlotChange;
        let s = store();
        let rel = Path::new("a/c/0");
        let one = [1u8; 4];
        let put = |slot, data: Option<&[u8]>, closed| {
            let mut m =
                move |_: &crate::store::ShardSnapshot<'_>| vec![SlotChange { slot, data, closed }];
            s.commit_shard(rel, &level(), &mut m).unwrap()
        };
        put(0, Some(&one), 10);
        let out = put(0, None, 20);
        assert!(!out.removed && out.index.entries().iter().all(Option::is_none));
        let bytes = s.read_all(rel).unwrap().unwrap();
        let mut seen = 0;
        rewrite_shard(rel, &level(), Some(&bytes), &mut |snap| {
            seen = snap.times.get(0);
            Vec::new()
        })
        .unwrap();
        assert_eq!(seen, 20, "the deletion's close time is kept");
    }

    #[test]
    fn files_open_for_writing_are_stored_at_sync_and_close() {
        let s = store();
        let f = s
            .open_rw(Path::new("g/.zattrs"), OpenMode::CreateNew, false)
            .unwrap();
        assert_eq!(s.stat(Path::new("g/.zattrs")).unwrap().unwrap().len, 0);
        f.write_all_at(b"{\"a\": 1}", 0).unwrap();
        assert_eq!(s.stat(Path::new("g/.zattrs")).unwrap().unwrap().len, 8);
        f.sync().unwrap();
        f.write_all_at(b"2", 6).unwrap();
        drop(f);
        assert_eq!(
            s.read_all(Path::new("g/.zattrs")).unwrap().unwrap(),
            b"{\"a\": 2}"
        );
        assert_eq!(
            s.open_rw(Path::new("g/.zattrs"), OpenMode::CreateNew, false)
                .err()
                .and_then(|e| e.raw_os_error()),
            Some(libc::EEXIST)
        );
    }
}
