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
use super::memory::{dense_shard, densify, rewrite_shard};
use super::{EntryKind, EntryMeta, ListEntry, OpenMode, SpaceInfo, Store, StoreFile, StoreFileRw};
use crate::format::ShardLevel;

/// How often a shard commit tries again when another writer changed the shard first.
const COMMIT_ATTEMPTS: u32 = 12;

/// How long one request may keep failing (an unreachable endpoint, 5xx answers), its
/// retries included, before the operation fails with EIO, unless told otherwise
/// (`--s3-timeout`). A connection attempt itself gives up after 5 s and a request after
/// 30 s (object_store's defaults).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Memory for read-ahead of all open objects together, unless told otherwise
/// (`--s3-cache`).
pub const DEFAULT_READ_AHEAD: u64 = 256 << 20;

/// How a mount talks to object storage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Options {
    /// How long one request may keep failing, its retries included.
    pub timeout: Duration,
    /// Bytes all open objects together may hold read ahead.
    pub read_ahead: u64,
    /// How long what a HEAD or a listing found about a name is used again without
    /// asking ([`MetaCache`]); zero: ask every time.
    pub meta_ttl: Duration,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            timeout: DEFAULT_TIMEOUT,
            read_ahead: DEFAULT_READ_AHEAD,
            meta_ttl: Duration::ZERO,
        }
    }
}

/// What HEADs and listings found, used again for a while: one lookup and read of a chunk
/// asks about its shard several times (its attributes, its key directory, the open), and
/// a pass over many chunks asks about one shard for each. This store's own writes and
/// deletes update it at once, and a read that finds its object changed (412) drops the
/// name, so only other writers' changes wait up to the TTL.
struct MetaCache {
    ttl: Duration,
    heads: Timed<Option<object_store::ObjectMeta>>,
    children: Timed<bool>,
    listings: Timed<Arc<Vec<ListEntry>>>,
    /// Bumped by every `forget`: an answer asked for before a forget (a listing in
    /// flight while this mount wrote below it) is not kept, so it cannot bring back what
    /// the forget dropped.
    forgets: std::sync::atomic::AtomicU64,
}

/// Answers per name, with when they were had.
type Timed<T> = Mutex<HashMap<PathBuf, (std::time::Instant, T)>>;

/// Entries kept at most; past that the cache starts again empty.
const META_CACHE_ENTRIES: usize = 100_000;
/// HEAD answers taken from one listing at most (a listing of a huge directory would
/// otherwise push everything else out of the cache).
const LISTED_HEADS: usize = 10_000;

impl MetaCache {
    fn new(ttl: Duration) -> Self {
        MetaCache {
            ttl,
            heads: Mutex::default(),
            children: Mutex::default(),
            listings: Mutex::default(),
            forgets: Default::default(),
        }
    }

    /// Take before asking the store; give to [`MetaCache::keep`] with the answer.
    fn generation(&self) -> u64 {
        self.forgets.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn fresh<T: Clone>(&self, map: &Timed<T>, rel: &Path) -> Option<T> {
        if self.ttl.is_zero() {
            return None;
        }
        let map = map.lock();
        let (at, v) = map.get(rel)?;
        (at.elapsed() < self.ttl).then(|| v.clone())
    }

    /// Keep `v`, asked for at `generation`, unless something was forgotten since.
    fn keep<T>(&self, map: &Timed<T>, rel: &Path, v: T, generation: u64) {
        if self.ttl.is_zero() {
            return;
        }
        let mut map = map.lock();
        // Checked under the map's lock, and `forget` bumps before it takes the lock: an
        // answer kept here before the bump is removed by that forget.
        if self.generation() != generation {
            return;
        }
        if map.len() >= META_CACHE_ENTRIES {
            map.clear();
        }
        map.insert(rel.to_path_buf(), (std::time::Instant::now(), v));
    }

    /// `rel` was written or deleted here (or found changed): forget what was known of it
    /// and of its parents' listings.
    fn forget(&self, rel: &Path) {
        self.forgets
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.heads.lock().remove(rel);
        let mut children = self.children.lock();
        let mut listings = self.listings.lock();
        for d in rel.ancestors() {
            children.remove(d);
            listings.remove(d);
        }
    }
}

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
    /// Memory for bytes read ahead, shared by every open object.
    budget: Arc<Budget>,
    counters: Arc<Counters>,
    meta: Arc<MetaCache>,
    /// The longest any one request may take, its retries included (`--s3-timeout`).
    deadline: Duration,
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
    /// failing is retried, with backoff, for up to `opts.timeout`.
    pub fn open_url(url: &str, opts: &S3Options) -> Result<Self, OpenError> {
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
        // object_store refuses plain http unless told ("builder error"): say how.
        for var in ["AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3"] {
            if let Ok(v) = std::env::var(var)
                && v.starts_with("http://")
                && !std::env::var("AWS_ALLOW_HTTP").is_ok_and(|a| {
                    // What object_store takes for yes.
                    ["true", "1", "on", "yes", "y"]
                        .iter()
                        .any(|y| a.eq_ignore_ascii_case(y))
                })
            {
                return Err(err(format!(
                    "{var}={v:?} is plain http: set AWS_ALLOW_HTTP=true to use it"
                )));
            }
        }
        let mut builder = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_retry(object_store::RetryConfig {
                backoff: object_store::BackoffConfig::default(),
                max_retries: 10,
                retry_timeout: opts.timeout,
            });
        // Each HTTP request (a listing's pages each) gives up after --s3-timeout too: a
        // listing runs under this alone, not under one deadline for all its pages.
        let ms = |d: Duration| format!("{}ms", d.as_millis().max(1));
        builder = builder
            .with_config(
                object_store::aws::AmazonS3ConfigKey::Client(
                    object_store::ClientConfigKey::Timeout,
                ),
                ms(opts.timeout),
            )
            .with_config(
                object_store::aws::AmazonS3ConfigKey::Client(
                    object_store::ClientConfigKey::ConnectTimeout,
                ),
                ms(opts.timeout.min(Duration::from_secs(5))),
            );
        if std::env::var_os("AWS_REGION").is_none()
            && let Ok(region) = std::env::var("AWS_DEFAULT_REGION")
        {
            builder = builder.with_region(region);
        }
        let s3 = builder.build().map_err(|e| err(e.to_string()))?;
        let mut store = Self::new(Arc::new(s3), prefix, url).map_err(|e| err(e.to_string()))?;
        store.budget = Arc::new(Budget::new(opts.read_ahead));
        store.deadline = opts.timeout;
        store.meta = Arc::new(MetaCache::new(opts.meta_ttl));
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
            budget: Arc::new(Budget::new(DEFAULT_READ_AHEAD)),
            counters: Arc::default(),
            meta: Arc::new(MetaCache::new(Duration::ZERO)),
            deadline: DEFAULT_TIMEOUT,
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

    /// What this store has requested so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The read-ahead memory in use and its cap.
    pub fn read_ahead(&self) -> (u64, u64) {
        (self.budget.used(), self.budget.cap)
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

    fn block_on<T>(&self, f: impl Future<Output = ObjResult<T>>) -> ObjResult<T> {
        within(self.rt.handle(), self.deadline, f)
    }

    fn head(&self, rel: &Path) -> io::Result<Option<object_store::ObjectMeta>> {
        if rel.as_os_str().is_empty() {
            return Ok(None);
        }
        if let Some(known) = self.meta.fresh(&self.meta.heads, rel) {
            return Ok(known);
        }
        if self.listed_absent(rel) {
            return Ok(None);
        }
        let generation = self.meta.generation();
        self.counters
            .heads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = self.key(rel)?;
        log::debug!("HEAD {key}");
        let found = match self.block_on(self.inner.head(&key)) {
            Ok(m) => Some(m),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => return Err(to_io(rel, e)),
        };
        self.meta
            .keep(&self.meta.heads, rel, found.clone(), generation);
        Ok(found)
    }

    /// The objects and common prefixes right below `rel`, as names.
    /// And the cache generation it was asked at (for keeping the listing).
    fn list_objects(&self, rel: &Path) -> io::Result<(Vec<ListEntry>, u64)> {
        let generation = self.meta.generation();
        self.counters
            .lists
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = self.key(rel)?;
        log::debug!("LIST {key}/");
        // Not under one deadline: a listing is a request per page of 1,000 names, each
        // given up after --s3-timeout by the client.
        let l = self
            .rt
            .block_on(self.inner.list_with_delimiter(Some(&key)))
            .map_err(|e| to_io(rel, e))?;
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        for p in &l.common_prefixes {
            if let Some((name, _)) = name_of(p)
                && seen.insert(name.clone())
            {
                out.push(ListEntry {
                    name: OsString::from(name),
                    kind: EntryKind::Dir,
                });
            }
        }
        for o in &l.objects {
            if let Some((name, _)) = name_of(&o.location)
                && o.location != key
                && seen.insert(name.clone())
            {
                out.push(ListEntry {
                    name: OsString::from(name),
                    kind: EntryKind::File,
                });
            }
        }
        // Sorted by name: `listed_absent` looks names up in it by bisection (a key
        // directory of a flat array can hold 10^5 names).
        out.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        self.keep_listed_heads(rel, &key, &l.objects, generation);
        // What a HEAD and a listing of each directory listed would say: no object has
        // its name, and something lies below it (`stat` of a directory just listed, as
        // `ls -l` and `cp -r` do, asks nothing more). A name that is both is an object.
        let objects: BTreeSet<String> = l
            .objects
            .iter()
            .filter_map(|o| name_of(&o.location).map(|(n, _)| n))
            .collect();
        for p in l.common_prefixes.iter().take(LISTED_HEADS) {
            if let Some((name, true)) = name_of(p)
                && !objects.contains(&name)
            {
                let below = rel.join(name);
                self.meta.keep(&self.meta.heads, &below, None, generation);
                self.meta
                    .keep(&self.meta.children, &below, true, generation);
            }
        }
        self.meta
            .keep(&self.meta.children, rel, !out.is_empty(), generation);
        Ok((out, generation))
    }

    /// The objects and common prefixes right below `rel`: a listing kept for the TTL,
    /// or a LIST.
    fn listing(&self, rel: &Path) -> io::Result<Arc<Vec<ListEntry>>> {
        if let Some(known) = self.meta.fresh(&self.meta.listings, rel) {
            return Ok(known);
        }
        if self.listed_absent(rel) {
            return Ok(Arc::default());
        }
        let (listed, generation) = self.list_objects(rel)?;
        let listed = Arc::new(listed);
        self.meta
            .keep(&self.meta.listings, rel, listed.clone(), generation);
        Ok(listed)
    }

    /// A listing gives each object's size and ETag, as a HEAD would: keep them as the
    /// HEAD answers of those objects, so opening a shard just listed asks nothing more.
    fn keep_listed_heads(
        &self,
        rel: &Path,
        key: &ObjPath,
        objects: &[object_store::ObjectMeta],
        generation: u64,
    ) {
        for o in objects.iter().take(LISTED_HEADS) {
            if let Some((name, true)) = name_of(&o.location)
                && o.location != *key
                && o.e_tag.is_some()
            {
                self.meta.keep(
                    &self.meta.heads,
                    &rel.join(name),
                    Some(o.clone()),
                    generation,
                );
            }
        }
    }

    /// Whether a fresh listing of `rel`'s parent has no entry of its name: then no
    /// object has that name and none lies below it (a view of an array asks for files of
    /// their own at every key directory it lists: without this, a LIST and a HEAD each).
    fn listed_absent(&self, rel: &Path) -> bool {
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            return false;
        };
        self.meta
            .fresh(&self.meta.listings, parent)
            .is_some_and(|l| {
                l.binary_search_by(|e| e.name.as_os_str().cmp(name))
                    .is_err()
            })
    }

    /// Whether any object lies below `rel`.
    fn has_children(&self, rel: &Path) -> io::Result<bool> {
        if let Some(known) = self.meta.fresh(&self.meta.children, rel) {
            return Ok(known);
        }
        Ok(!self.listing(rel)?.is_empty())
    }

    fn put(&self, rel: &Path, data: Vec<u8>, mode: PutMode) -> io::Result<()> {
        let key = self.key(rel)?;
        let opts = PutOptions {
            mode,
            ..Default::default()
        };
        let put = self.block_on(self.inner.put_opts(&key, PutPayload::from(data), opts));
        // Whatever happened (a lost race says the object changed), ask next time.
        self.meta.forget(rel);
        put.map_err(|e| to_io(rel, e))?;
        let mut dirs = self.dirs.lock();
        for d in rel.ancestors().skip(1) {
            dirs.remove(d);
        }
        Ok(())
    }

    /// The whole object and its version; `None` when there is none.
    fn get_versioned(&self, rel: &Path) -> io::Result<Option<(Vec<u8>, UpdateVersion)>> {
        let key = self.key(rel)?;
        self.counters
            .gets
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match self.block_on(async {
            let r = self.inner.get(&key).await?;
            let version = UpdateVersion {
                e_tag: r.meta.e_tag.clone(),
                version: r.meta.version.clone(),
            };
            Ok::<_, object_store::Error>((r.bytes().await?.to_vec(), version))
        }) {
            Ok(v) => {
                self.counters
                    .get_bytes
                    .fetch_add(v.0.len() as u64, std::sync::atomic::Ordering::Relaxed);
                Ok(Some(v))
            }
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

type ObjResult<T> = Result<T, object_store::Error>;

/// No answer within `--s3-timeout`: what a request that outlived it fails with.
#[derive(Debug, thiserror::Error)]
#[error("timed out: no answer within {}s (--s3-timeout)", .0.as_secs_f64())]
struct TimedOut(Duration);

/// `f`, failing with [`TimedOut`] after `deadline`: a stalled endpoint (an answer that
/// never comes or never ends) holds no request longer, whatever the client's own
/// timeouts and retries do (issue 34: a hanging request took 30 s with
/// `--s3-timeout 3`).
async fn timed<T>(deadline: Duration, f: impl Future<Output = ObjResult<T>>) -> ObjResult<T> {
    match tokio::time::timeout(deadline, f).await {
        Ok(res) => res,
        Err(_) => Err(object_store::Error::Generic {
            store: "S3",
            source: Box::new(TimedOut(deadline)),
        }),
    }
}

/// [`timed`], on the runtime behind `handle`, from a thread outside it.
fn within<T>(
    handle: &tokio::runtime::Handle,
    deadline: Duration,
    f: impl Future<Output = ObjResult<T>>,
) -> ObjResult<T> {
    handle.block_on(timed(deadline, f))
}

/// The last part of a listed `path` as a name, and whether this store reaches the object
/// by that name ([`ObjectStoreStore::key`] makes the listed key from it). object_store
/// percent-encodes the characters of a part it keeps out of keys (`notes~` is stored as
/// `notes%7E`) and hands listed keys back so: decoded, that is the name it was made
/// from (a listing showed `notes%7E`). A key another tool wrote (`notes~` itself, or
/// `x%2Fy`) may decode to a name that is no file name (`x/y`, `.`) or that leads to
/// another key: then the part is shown as it is, and answers about the object are not
/// kept under the name (`false`).
fn name_of(path: &ObjPath) -> Option<(String, bool)> {
    let part = path.filename()?;
    let decoded = percent_encoding::percent_decode_str(part)
        .decode_utf8()
        .ok()
        .filter(|n| is_file_name(n));
    match decoded {
        Some(n) if object_store::path::PathPart::from(n.as_ref()).as_ref() == part => {
            Some((n.into_owned(), true))
        }
        _ if is_file_name(part) => Some((
            part.to_string(),
            object_store::path::PathPart::from(part).as_ref() == part,
        )),
        _ => None,
    }
}

/// Whether `n` can be a name in a directory.
fn is_file_name(n: &str) -> bool {
    !n.is_empty() && n != "." && n != ".." && !n.contains(['/', '\0'])
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
    // The causes too: a request the client gave up on says "error sending request",
    // and only its source says that it timed out.
    let mut causes = String::new();
    let mut cause: Option<&dyn std::error::Error> = Some(e);
    while let Some(c) = cause {
        causes.push_str(&c.to_string().to_lowercase());
        causes.push('\n');
        cause = c.source();
    }
    match e {
        // Without credentials in the environment the client asks the EC2 instance
        // metadata service; off EC2 that fails in ways that read like something else.
        _ if full.contains("169.254.169.254") => format!(
            "no credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set, and \
             the instance metadata service (169.254.169.254) gave none ({text})"
        ),
        object_store::Error::NotFound { .. } => format!("no such bucket ({text})"),
        object_store::Error::PermissionDenied { .. } => format!("access denied (403): {text}"),
        object_store::Error::Unauthenticated { .. } => {
            format!("the credentials were refused: {text}")
        }
        // Ours ([`TimedOut`]), or the client's own: a timeout says timeout.
        _ if causes.contains("timed out") => {
            format!("the endpoint did not answer in time: {text}")
        }
        _ if full.contains("NoSuchBucket") || lower.contains("bucket does not exist") => {
            format!("no such bucket ({text})")
        }
        // A status 403, not any "403" (a key, a byte count, a duration in the text).
        _ if lower.contains("accessdenied")
            || lower.contains("status 403")
            || lower.contains("403 forbidden") =>
        {
            format!("access denied (403): {text}")
        }
        _ if lower.contains("connect")
            || lower.contains("error sending request")
            || lower.contains("dns") =>
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
    // The ETag alone where there is one: a listing and a HEAD of one object agree on it,
    // but not on the version (a listing has none) nor on the time's precision (a
    // listing's has milliseconds, a HEAD's whole seconds); an answer from either must
    // not look like a change of the object.
    match &m.e_tag {
        Some(e) => e.hash(&mut h),
        None => m.version.hash(&mut h),
    }
    let mtime = SystemTime::UNIX_EPOCH
        + Duration::from_secs(u64::try_from(m.last_modified.timestamp()).unwrap_or(0));
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

/// An object open for reading: ranged GETs of the version it was opened at, with
/// read-ahead once reads go forward through it.
struct ObjectFile {
    store: Arc<dyn ObjectStore>,
    handle: tokio::runtime::Handle,
    key: ObjPath,
    meta: object_store::ObjectMeta,
    ahead: Mutex<ReadAhead>,
    /// Signalled when a window fetch ends (readers waiting for the window in flight).
    ahead_done: parking_lot::Condvar,
    budget: Arc<Budget>,
    counters: Arc<Counters>,
    /// To forget this name when it turns out changed.
    meta_cache: Arc<MetaCache>,
    rel: PathBuf,
    deadline: Duration,
}

/// The first and the largest read-ahead window; each window is 4 times the last. On
/// object storage a request costs about the same whatever its size up to a few MiB, so
/// reading forward through a shard should take few of them: a 4 MiB shard read chunk by
/// chunk takes its index, two chunks and the rest.
const MIN_WINDOW: u64 = 4 << 20;
const MAX_WINDOW: u64 = 8 << 20;
/// A read that starts at most this far past where the last one ended still counts as
/// going forward (chunks a reader skipped, an index between blocks).
const FORWARD_GAP: u64 = 64 << 10;
/// An object of at most this size is fetched whole (less the chunk read before) once a
/// second chunk of it is read, in whatever order: zarr-python lays a shard's chunks in
/// Morton order, so a reader of the chunk files in key order jumps about inside each
/// shard, and read-ahead by file offsets never started (issue 34: 261 GETs in series
/// for a 4-shard array, where 9 do).
const WHOLE_MAX: u64 = 16 << 20;

/// Read-ahead state of one open object: where the last read's chunk ended, the window the
/// next forward read fetches, and the bytes fetched ahead.
#[derive(Default)]
struct ReadAhead {
    /// The end of the last read's chunk (of the read, outside chunks).
    next: Option<u64>,
    /// The chunk (or the read, outside chunks) the last read was part of.
    unit: Option<std::ops::Range<u64>>,
    /// Forward steps in a row, counted when a read misses the window held (then at
    /// least `seq`): two or more and a window is fetched.
    streak: u32,
    /// Forward steps (chunks, or reads outside chunks) in a row, whatever served them:
    /// one or more (two chunks in a row) and the file is being read through
    /// ([`StoreFile::streaming`]).
    seq: u32,
    /// Bytes the window held has served: once it has served as many as it holds, its
    /// reader has most likely gone through it, and it is dropped (a shard stays cached
    /// long after it was read; the window it held would keep the budget from the next).
    served: u64,
    window: u64,
    /// Distinct chunks read (steps inside chunks): at two, the object is fetched whole
    /// ([`WHOLE_MAX`]) and the file says it is being read through.
    chunks: u32,
    /// The first chunk read, left out of the whole fetch (its reader has it).
    first_chunk: Option<std::ops::Range<u64>>,
    /// Whether the object was fetched whole (or that was tried): once per open file.
    whole: bool,
    /// Bytes read outside chunks (a shard's index): a whole fetch holds them again,
    /// and its reader will not ask for them again, so they count as served.
    outside: u64,
    held: Option<Held>,
    /// The window being fetched now: a reader inside it waits for it rather than
    /// fetching the same bytes again (zarr-python reads the chunks of a shard side by
    /// side).
    pending: Option<std::ops::Range<u64>>,
}

/// Bytes fetched ahead: pieces `(start, bytes)` of the object, in order and apart (a
/// window is one; a whole object less a chunk read before, two), counted against the
/// store's budget while held.
struct Held {
    pieces: Vec<(u64, bytes::Bytes)>,
    budget: Arc<Budget>,
}

impl Held {
    fn len(&self) -> u64 {
        self.pieces.iter().map(|(_, b)| b.len() as u64).sum()
    }

    /// Where the last piece ends.
    fn end(&self) -> u64 {
        self.pieces
            .last()
            .map_or(0, |(start, b)| start + b.len() as u64)
    }

    /// Bytes `offset..end` of the object, if one piece holds them all.
    fn slice(&self, offset: u64, end: u64) -> Option<&[u8]> {
        self.pieces.iter().find_map(|(start, b)| {
            (*start <= offset && end <= start + b.len() as u64)
                .then(|| &b[(offset - start) as usize..(end - start) as usize])
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.release(self.len());
    }
}

/// The memory all open objects of a store may hold fetched ahead (`--s3-cache`): a
/// forward read that would exceed it fetches only what was asked for.
pub struct Budget {
    cap: u64,
    used: std::sync::atomic::AtomicU64,
}

impl Budget {
    pub fn new(cap: u64) -> Self {
        Budget {
            cap,
            used: Default::default(),
        }
    }

    fn reserve(&self, n: u64) -> bool {
        self.reserve_within(n, self.cap)
    }

    /// Reserve `n` bytes if that leaves at most `limit` in use.
    fn reserve_within(&self, n: u64, limit: u64) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.used
            .fetch_update(SeqCst, SeqCst, |u| {
                u.checked_add(n)
                    .filter(|&total| total <= limit.min(self.cap))
            })
            .is_ok()
    }

    fn release(&self, n: u64) {
        self.used.fetch_sub(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Requests this store made, and the bytes its GETs brought (for tests and `stats`).
#[derive(Default)]
pub struct Counters {
    pub gets: std::sync::atomic::AtomicU64,
    pub get_bytes: std::sync::atomic::AtomicU64,
    pub heads: std::sync::atomic::AtomicU64,
    pub lists: std::sync::atomic::AtomicU64,
}

impl ObjectFile {
    /// `range` of the object, as the version this file was opened at.
    fn fetch(&self, range: std::ops::Range<u64>) -> io::Result<bytes::Bytes> {
        let start = range.start;
        let mut got = self.fetch_pieces(std::slice::from_ref(&range))?;
        Ok(got.pop().map_or_else(bytes::Bytes::new, |(s, b)| {
            debug_assert_eq!(s, start);
            b
        }))
    }

    /// `ranges` of the object, as the version this file was opened at: one GET each, all
    /// in flight at once.
    fn fetch_pieces(
        &self,
        ranges: &[std::ops::Range<u64>],
    ) -> io::Result<Vec<(u64, bytes::Bytes)>> {
        use std::sync::atomic::Ordering::Relaxed;
        let gets: Vec<_> = ranges
            .iter()
            .map(|range| {
                let (store, key) = (self.store.clone(), self.key.clone());
                let opts = GetOptions {
                    range: Some(GetRange::Bounded(range.clone())),
                    if_match: self.meta.e_tag.clone(),
                    ..Default::default()
                };
                let deadline = self.deadline;
                log::debug!("GET {} bytes {}..{}", self.key, range.start, range.end);
                self.handle.spawn(async move {
                    let get = async { store.get_opts(&key, opts).await?.bytes().await };
                    timed(deadline, get).await
                })
            })
            .collect();
        let got = self.handle.block_on(async {
            let mut out = Vec::with_capacity(gets.len());
            for get in gets {
                out.push(get.await);
            }
            out
        });
        let mut pieces = Vec::with_capacity(got.len());
        let mut failed = None;
        for (range, got) in ranges.iter().zip(got) {
            let got = got.unwrap_or_else(|join| {
                Err(object_store::Error::Generic {
                    store: "S3",
                    source: Box::new(join),
                })
            });
            match got {
                Ok(bytes) => {
                    self.counters.gets.fetch_add(1, Relaxed);
                    self.counters
                        .get_bytes
                        .fetch_add(bytes.len() as u64, Relaxed);
                    pieces.push((range.start, bytes));
                }
                Err(e) => {
                    if let object_store::Error::Precondition { .. }
                    | object_store::Error::NotFound { .. } = &e
                    {
                        self.meta_cache.forget(&self.rel);
                    }
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) => Err(to_io(Path::new(self.key.as_ref()), e)),
            None => Ok(pieces),
        }
    }
}

/// A window being fetched: on drop, its in-flight mark is cleared (if still its own),
/// what it reserved of the budget and does not hold is given back, and its waiters wake.
struct InFlight<'a> {
    file: &'a ObjectFile,
    range: std::ops::Range<u64>,
    reserved: u64,
}

impl InFlight<'_> {
    /// The window came, in `pieces`: hold it (what it holds stays reserved until it is
    /// dropped). `served`: bytes of it the reader that fetched it has taken.
    fn hold(mut self, pieces: Vec<(u64, bytes::Bytes)>, served: u64) {
        let f = self.file;
        let held = Held {
            pieces,
            budget: f.budget.clone(),
        };
        let len = held.len();
        let mut ra = f.ahead.lock();
        ra.held = Some(held);
        ra.served = served;
        drop(ra);
        self.reserved = self.reserved.saturating_sub(len);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let f = self.file;
        let mut ra = f.ahead.lock();
        if ra.pending.as_ref() == Some(&self.range) {
            ra.pending = None;
        }
        f.budget.release(self.reserved);
        f.ahead_done.notify_all();
    }
}

impl ObjectFile {
    /// A read served from bytes fetched ahead, or ranged GETs: of what was asked for
    /// (to the end of its chunk, when it is part of one: the kernel asks for a large
    /// chunk in pieces, and a cold read of one chunk moves that chunk only) when reads
    /// jump around, of a window that grows up to [`MAX_WINDOW`] while they go forward,
    /// and of the whole object (up to [`WHOLE_MAX`], less the first chunk read) once a
    /// second chunk of it is read, in whatever order. Forward is counted in chunks: the
    /// pieces of one chunk are one step.
    fn read_in(
        &self,
        buf: &mut [u8],
        offset: u64,
        chunk: Option<std::ops::Range<u64>>,
    ) -> io::Result<usize> {
        let size = self.meta.size;
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let end = size.min(offset + buf.len() as u64);
        let want = (end - offset) as usize;
        // What this read is part of: its chunk, or itself.
        let (unit, in_chunk) = match chunk {
            Some(c) if c.start <= offset && end <= c.end => (c.start..c.end.min(size), true),
            _ => (offset..end, false),
        };
        // Forward: from where the last read's chunk ended, or from the end of the window
        // held (readers of one file side by side, as zarr-python's, take turns in it).
        let after = |n: u64| unit.start >= n && unit.start - n <= FORWARD_GAP;
        // What to fetch, what of the budget it took, the range marked in flight (the
        // one its waiters wait for, cleared by the `InFlight` below: the same range),
        // and what the reader had of it before.
        let (fetch, reserved, in_flight, served_before) = {
            let mut ra = self.ahead.lock();
            if !in_chunk {
                ra.outside = ra.outside.saturating_add(want as u64);
            }
            // The next piece of the chunk the last read was in is no new step.
            let step = ra.unit != Some(unit.clone());
            if step {
                ra.seq = if ra.next.is_some_and(after) {
                    ra.seq.saturating_add(1)
                } else {
                    0
                };
            }
            loop {
                if let Some(h) = &ra.held
                    && let Some(bytes) = h.slice(offset, end)
                {
                    buf[..want].copy_from_slice(bytes);
                    let held = h.len();
                    ra.next = Some(unit.end);
                    ra.unit = Some(unit.clone());
                    ra.served += want as u64;
                    if ra.served >= held {
                        ra.held = None;
                    }
                    return Ok(want);
                }
                match &ra.pending {
                    Some(p) if p.start <= offset && end <= p.end => self.ahead_done.wait(&mut ra),
                    _ => break,
                }
            }
            let mut whole = false;
            if step && in_chunk {
                ra.chunks = ra.chunks.saturating_add(1);
                let first = ra.first_chunk.get_or_insert_with(|| unit.clone()).clone();
                whole = ra.chunks >= 2 && !ra.whole && size <= WHOLE_MAX && first != unit;
            }
            if step {
                let forward =
                    ra.next.is_some_and(after) || ra.held.as_ref().is_some_and(|h| after(h.end()));
                // Two forward steps in a row before fetching ahead: the first chunk
                // after an index at the start of a shard is forward too, and a cold read
                // of one chunk must move only that chunk. Steps the window held served
                // count.
                ra.streak = if forward {
                    ra.streak.saturating_add(1).max(ra.seq)
                } else {
                    0
                };
                ra.window = if ra.streak >= 2 {
                    (ra.window * 4).clamp(MIN_WINDOW, MAX_WINDOW)
                } else {
                    0
                };
            }
            ra.next = Some(unit.end);
            ra.unit = Some(unit.clone());
            // A second chunk: the whole object but the first chunk, whose reader has it
            // (a shard's chunks lie apart, so this one is in one of the two pieces).
            let whole = whole.then(|| {
                ra.whole = true;
                let first = ra.first_chunk.clone().unwrap_or(0..0);
                let pieces: Vec<_> = [0..first.start, first.end..size]
                    .into_iter()
                    .filter(|r| !r.is_empty())
                    .collect();
                let need: u64 = pieces.iter().map(|r| r.end - r.start).sum();
                (pieces, need)
            });
            if let Some((pieces, need)) = whole.filter(|(pieces, need)| {
                pieces.iter().any(|r| r.start <= offset && end <= r.end)
                    && self.budget.reserve(*need)
            }) {
                ra.held = None;
                ra.pending = Some(0..size);
                (pieces, need, 0..size, ra.outside)
            } else {
                // A window when going forward: the window held gives way to it (and its
                // budget with it). Else the rest of the chunk (its next pieces will be
                // asked for next), unless a window is held: a read elsewhere leaves that
                // for the readers still inside it (side by side, or a shard loaded ahead
                // whole).
                let window = if step { ra.window } else { 0 };
                let rest = if ra.held.is_none() {
                    unit.end.min(offset + MAX_WINDOW)
                } else {
                    end
                };
                let ahead_end = size.min(offset + window).max(rest);
                if window > 0 && ahead_end > end {
                    ra.held = None;
                }
                if ahead_end > end && self.budget.reserve(ahead_end - offset) {
                    ra.pending = Some(offset..ahead_end);
                    (
                        std::iter::once(offset..ahead_end).collect(),
                        ahead_end - offset,
                        offset..ahead_end,
                        0,
                    )
                } else {
                    (std::iter::once(offset..end).collect(), 0, offset..end, 0)
                }
            }
        };
        // However the fetch of a window ends (an error, a panic), its in-flight mark goes
        // and its waiters wake: none waits for ever.
        let mut window = (reserved > 0).then(|| InFlight {
            file: self,
            range: in_flight,
            reserved,
        });
        let started = std::time::Instant::now();
        let pieces = match self.fetch_pieces(&fetch) {
            Ok(pieces) => pieces,
            // The read ahead failed, not for want of time (an outage would fail the read
            // alone too, after as long again) nor because the object changed or went
            // (ESTALE, ENOENT: so would the read): its waiters go their own way, and this
            // read fetches what it asked for alone.
            Err(e)
                if window.is_some()
                    && e.raw_os_error() == Some(libc::EIO)
                    && started.elapsed() < self.deadline / 2 =>
            {
                window = None;
                vec![(offset, self.fetch(offset..end)?)]
            }
            Err(e) => return Err(e),
        };
        // The piece this read lies in (what came of it, if the object ended early).
        let got = pieces
            .iter()
            .find(|(start, b)| *start <= offset && offset < start + b.len() as u64)
            .map_or(&[][..], |(start, b)| &b[(offset - start) as usize..]);
        let n = got.len().min(want);
        buf[..n].copy_from_slice(&got[..n]);
        if let Some(w) = window {
            w.hold(pieces, n as u64 + served_before);
        }
        Ok(n)
    }
}

impl StoreFile for ObjectFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.read_in(buf, offset, None)
    }

    fn read_chunk_at(
        &self,
        buf: &mut [u8],
        offset: u64,
        chunk: std::ops::Range<u64>,
    ) -> io::Result<usize> {
        self.read_in(buf, offset, Some(chunk))
    }

    fn meta(&self) -> io::Result<EntryMeta> {
        Ok(meta_of(&self.meta))
    }

    fn streaming(&self) -> bool {
        let ra = self.ahead.lock();
        ra.seq >= 1 || ra.chunks >= 2
    }

    /// One GET of the object's first [`MAX_WINDOW`] bytes (all of a shard of up to 8
    /// MiB: its index and its chunks), held as a window, while it leaves half the budget
    /// free (a shard loaded ahead and never read through keeps its window until the shard
    /// leaves the cache: the readers' own windows always have the other half).
    fn warm(&self) {
        let len = self.meta.size.min(MAX_WINDOW);
        {
            let mut ra = self.ahead.lock();
            if len == 0
                || ra.held.is_some()
                || ra.pending.is_some()
                || !self.budget.reserve_within(len, self.budget.cap / 2)
            {
                return;
            }
            ra.pending = Some(0..len);
        }
        let window = InFlight {
            file: self,
            range: 0..len,
            reserved: len,
        };
        if let Ok(bytes) = self.fetch(0..len) {
            window.hold(vec![(0, bytes)], 0);
        }
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
    meta: Arc<MetaCache>,
    deadline: Duration,
}

impl ObjectFileRw {
    fn flush(&self) -> io::Result<()> {
        let mut d = self.state.data.lock();
        if !d.1 {
            return Ok(());
        }
        let store = &self.store;
        let payload = PutPayload::from(d.0.clone());
        let put = within(
            &store.handle,
            store.deadline,
            store.inner.put(&store.key, payload),
        );
        store.meta.forget(&self.rel);
        put.map_err(|e| to_io(&self.rel, e))?;
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
        let listed = self.listing(rel)?;
        let mut out = listed.as_ref().clone();
        let mut seen: BTreeSet<String> = out
            .iter()
            .map(|e| e.name.to_string_lossy().into_owned())
            .collect();
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
            ahead: Mutex::new(ReadAhead::default()),
            ahead_done: parking_lot::Condvar::new(),
            budget: self.budget.clone(),
            counters: self.counters.clone(),
            meta_cache: self.meta.clone(),
            rel: rel.to_path_buf(),
            deadline: self.deadline,
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

    fn reads_are_requests(&self) -> bool {
        true
    }

    fn requests(&self) -> Vec<(&'static str, u64)> {
        use std::sync::atomic::Ordering::Relaxed;
        let c = &self.counters;
        vec![
            ("get", c.gets.load(Relaxed)),
            ("get_bytes", c.get_bytes.load(Relaxed)),
            ("head", c.heads.load(Relaxed)),
            ("list", c.lists.load(Relaxed)),
        ]
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

    fn rewrite_dense(
        &self,
        rel: &Path,
        level: &ShardLevel,
    ) -> Result<Option<(u64, u64)>, CommitError> {
        let io_err = |e: io::Error| CommitError::Io {
            path: rel.to_path_buf(),
            source: e,
        };
        let mut backoff = Duration::from_millis(10);
        for attempt in 1..=COMMIT_ATTEMPTS {
            let Some((current, version)) = self.get_versioned(rel).map_err(io_err)? else {
                return Ok(None);
            };
            let dense = densify(rel, level, &current)?;
            let lens = (current.len() as u64, dense.len() as u64);
            match self.put(rel, dense, PutMode::Update(version)) {
                Ok(()) => return Ok(Some(lens)),
                Err(e) if e.raw_os_error() == Some(libc::ESTALE) && attempt < COMMIT_ATTEMPTS => {
                    std::thread::sleep(backoff + jitter(backoff));
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(io_err(e)),
            }
        }
        Err(io_err(io::Error::other(
            "the shard kept changing under this rewrite",
        )))
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
                meta: self.meta.clone(),
                deadline: self.deadline,
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
        let deleted = self.block_on(self.inner.delete(&self.key(rel)?));
        self.meta.forget(rel);
        deleted.map_err(|e| to_io(rel, e))
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

    /// Reading a 4 MiB object forward in 64 KiB pieces takes a handful of GETs and moves
    /// each byte once; a jump back fetches only what it asks for; without budget every
    /// read is its own GET; the budget is given back when the files go.
    #[test]
    fn forward_reads_are_fetched_ahead_within_the_budget() {
        use std::sync::atomic::Ordering::Relaxed;
        let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
        for (cap, max_gets) in [(DEFAULT_READ_AHEAD, 8), (0, 64)] {
            let mut s = store();
            s.budget = Arc::new(Budget::new(cap));
            s.write_atomically(Path::new("a/shard"), &data).unwrap();
            let f = s.open(Path::new("a/shard")).unwrap().unwrap();
            let mut buf = vec![0u8; 64 << 10];
            for at in (0..data.len()).step_by(buf.len()) {
                assert_eq!(f.read_at(&mut buf, at as u64).unwrap(), buf.len());
                assert_eq!(buf, data[at..at + buf.len()], "at {at}");
            }
            let gets = s.counters().gets.load(Relaxed);
            assert!(
                (cap == 0 && gets == 64) || (cap > 0 && gets <= max_gets),
                "{gets} GETs with a budget of {cap}"
            );
            assert_eq!(s.counters().get_bytes.load(Relaxed), data.len() as u64);
            assert!(s.read_ahead().0 <= cap);
            // A jump back: exactly the bytes asked for.
            let before = s.counters().get_bytes.load(Relaxed);
            let mut small = [0u8; 100];
            f.read_at(&mut small, 1000).unwrap();
            assert_eq!(small[..], data[1000..1100]);
            assert_eq!(s.counters().get_bytes.load(Relaxed) - before, 100);
            drop(f);
            assert_eq!(s.read_ahead().0, 0, "the budget is given back");
        }
    }

    /// An answer asked for before this mount forgot a name (a listing in flight while a
    /// shard below it was written here) is not kept: it would bring the old ETag back.
    #[test]
    fn an_answer_from_before_a_forget_is_not_kept() {
        let m = MetaCache::new(Duration::from_secs(600));
        let before = m.generation();
        m.forget(Path::new("a/c/0"));
        m.keep(&m.children, Path::new("a"), true, before);
        assert_eq!(m.fresh(&m.children, Path::new("a")), None);
        m.keep(&m.children, Path::new("a"), true, m.generation());
        assert_eq!(m.fresh(&m.children, Path::new("a")), Some(true));
    }

    /// Readers of one open object side by side (zarr-python reads a shard's chunks from
    /// several threads) all get the right bytes, wait for a window in flight instead of
    /// hanging or fetching it again, and give the budget back.
    #[test]
    fn readers_side_by_side_share_the_windows() {
        use std::sync::atomic::Ordering::Relaxed;
        let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 253) as u8).collect();
        let s = store();
        s.write_atomically(Path::new("shard"), &data).unwrap();
        let f: Arc<dyn StoreFile> = Arc::from(s.open(Path::new("shard")).unwrap().unwrap());
        let chunk = 64 << 10;
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (f, data) = (f.clone(), data.clone());
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; chunk];
                    for i in (t..data.len() / chunk).step_by(4) {
                        let at = i * chunk;
                        assert_eq!(f.read_at(&mut buf, at as u64).unwrap(), chunk);
                        assert!(buf == data[at..at + chunk], "at {at}");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let moved = s.counters().get_bytes.load(Relaxed);
        assert!(moved >= data.len() as u64, "{moved}");
        drop(f);
        assert_eq!(s.read_ahead().0, 0, "the budget is given back");
    }

    /// A chunk the kernel asks for in pieces is fetched once, whole, and no more; the
    /// pieces of one chunk are one step forward, and three chunks in a row make the file
    /// say it is being read through (the view then loads the next shards ahead).
    #[test]
    fn a_chunk_read_in_pieces_is_one_get_and_chunks_in_a_row_stream() {
        use std::sync::atomic::Ordering::Relaxed;
        let data: Vec<u8> = (0..8u32 << 20).map(|i| (i % 249) as u8).collect();
        let s = store();
        s.write_atomically(Path::new("shard"), &data).unwrap();
        let f = s.open(Path::new("shard")).unwrap().unwrap();
        let chunk = (3u64 << 20)..(4u64 << 20);
        let mut buf = vec![0u8; 128 << 10];
        for at in (chunk.start..chunk.end).step_by(buf.len()) {
            assert_eq!(
                f.read_chunk_at(&mut buf, at, chunk.clone()).unwrap(),
                buf.len()
            );
            assert!(
                buf[..] == data[at as usize..at as usize + buf.len()],
                "at {at}"
            );
            assert!(!f.streaming(), "the pieces of one chunk are one step");
        }
        assert_eq!(s.counters().gets.load(Relaxed), 1);
        assert_eq!(s.counters().get_bytes.load(Relaxed), 1 << 20);
        assert_eq!(s.read_ahead().0, 0, "a chunk read through is not held");
        // Three small chunks in a row after it.
        let mut small = vec![0u8; 64 << 10];
        for k in 0..3u64 {
            let len = small.len() as u64;
            let at = chunk.end + k * len;
            f.read_chunk_at(&mut small, at, at..at + len).unwrap();
            assert!(small[..] == data[at as usize..at as usize + small.len()]);
        }
        assert!(f.streaming());
    }

    /// Chunks read in an order that jumps about (zarr-python lays a shard's chunks in
    /// Morton order; a reader in key order jumps inside it): the first chunk is fetched
    /// alone, the second brings the rest of the object in one go, and every other chunk
    /// reads from that; the file says it is being read through (the view then loads the
    /// next shards ahead); each byte moves once; the budget is given back.
    #[test]
    fn a_second_chunk_in_any_order_fetches_the_rest_of_the_object() {
        use std::sync::atomic::Ordering::Relaxed;
        let chunk = 96u64 << 10;
        let n = 64u64;
        let index = 16 * n + 4; // after the chunks, as zarr-python writes it
        let data: Vec<u8> = (0..(chunk * n + index) as u32)
            .map(|i| (i % 241) as u8)
            .collect();
        let s = store();
        s.write_atomically(Path::new("shard"), &data).unwrap();
        let f = s.open(Path::new("shard")).unwrap().unwrap();
        let mut idx = vec![0u8; index as usize];
        f.read_at(&mut idx, chunk * n).unwrap(); // a shard is loaded by its index
        assert!(idx[..] == data[(chunk * n) as usize..]);
        // Not forward: each chunk a stride of 7 from the last (mod 64), starting inside.
        let order: Vec<u64> = (0..n).map(|i| (5 + 7 * i) % n).collect();
        let mut buf = vec![0u8; 64 << 10]; // the kernel asks in pieces
        for (k, &c) in order.iter().enumerate() {
            let range = c * chunk..(c + 1) * chunk;
            for at in (range.start..range.end).step_by(buf.len()) {
                let len = (range.end - at).min(buf.len() as u64) as usize;
                let got = f.read_chunk_at(&mut buf[..len], at, range.clone()).unwrap();
                assert_eq!(got, len);
                assert!(
                    buf[..len] == data[at as usize..at as usize + len],
                    "at {at}"
                );
            }
            if k == 0 {
                assert!(!f.streaming(), "one chunk is not a reader going through");
                let moved = s.counters().get_bytes.load(Relaxed);
                assert_eq!(moved, index + chunk, "the index, then a cold chunk");
            }
        }
        assert!(f.streaming());
        // The index, the first chunk, then the object before it and after it (the index
        // again: a few bytes) side by side.
        assert_eq!(s.counters().gets.load(Relaxed), 4);
        assert_eq!(
            s.counters().get_bytes.load(Relaxed),
            data.len() as u64 + index
        );
        // Every chunk read: the window is let go, though its reader never asked again
        // for the index in it (else the budget stayed taken until the shard left the
        // cache, and later shards found none).
        assert_eq!(s.read_ahead().0, 0, "read through: let go");
        drop(f);
        // Beyond the budget: chunk by chunk, as before, and the budget stays whole.
        let mut s = store();
        s.budget = Arc::new(Budget::new(1 << 20));
        s.write_atomically(Path::new("shard"), &data).unwrap();
        let f = s.open(Path::new("shard")).unwrap().unwrap();
        let mut one = vec![0u8; chunk as usize];
        for &c in &order[..4] {
            let range = c * chunk..(c + 1) * chunk;
            f.read_chunk_at(&mut one, range.start, range.clone())
                .unwrap();
            assert!(one[..] == data[range.start as usize..range.end as usize]);
        }
        assert_eq!(s.counters().gets.load(Relaxed), 4);
        assert_eq!(s.read_ahead().0, 0);
    }

    /// An object store in which another writer's PUT of an object (the same bytes: a new
    /// ETag) lands right before each of the next `changes` conditional GETs of it, as
    /// another mount's commits between a HEAD and the GET of an index do.
    #[derive(Debug)]
    struct Racing {
        inner: object_store::memory::InMemory,
        changes: std::sync::atomic::AtomicU32,
    }

    impl std::fmt::Display for Racing {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "Racing")
        }
    }

    type Stream<T> = std::pin::Pin<Box<dyn futures_core::Stream<Item = T> + Send>>;

    #[async_trait::async_trait]
    impl ObjectStore for Racing {
        async fn put_opts(
            &self,
            location: &ObjPath,
            payload: PutPayload,
            opts: PutOptions,
        ) -> object_store::Result<object_store::PutResult> {
            self.inner.put_opts(location, payload, opts).await
        }

        async fn put_multipart_opts(
            &self,
            location: &ObjPath,
            opts: object_store::PutMultipartOptions,
        ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
            self.inner.put_multipart_opts(location, opts).await
        }

        async fn get_opts(
            &self,
            location: &ObjPath,
            options: GetOptions,
        ) -> object_store::Result<object_store::GetResult> {
            use std::sync::atomic::Ordering::SeqCst;
            if options.if_match.is_some()
                && self
                    .changes
                    .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            {
                let bytes = self.inner.get(location).await?.bytes().await?;
                self.inner.put(location, bytes.into()).await?;
            }
            self.inner.get_opts(location, options).await
        }

        fn delete_stream(
            &self,
            locations: Stream<object_store::Result<ObjPath>>,
        ) -> Stream<object_store::Result<ObjPath>> {
            self.inner.delete_stream(locations)
        }

        fn list(
            &self,
            prefix: Option<&ObjPath>,
        ) -> Stream<object_store::Result<object_store::ObjectMeta>> {
            self.inner.list(prefix)
        }

        async fn list_with_delimiter(
            &self,
            prefix: Option<&ObjPath>,
        ) -> object_store::Result<object_store::ListResult> {
            self.inner.list_with_delimiter(prefix).await
        }

        async fn copy_opts(
            &self,
            from: &ObjPath,
            to: &ObjPath,
            options: object_store::CopyOptions,
        ) -> object_store::Result<()> {
            self.inner.copy_opts(from, to, options).await
        }
    }

    /// A shard that another writer replaces between its HEAD and the GET of its index,
    /// several times in a row, is loaded again until it reads, never failed (issue 34:
    /// 8 of 464,000 reads got EIO while two other mounts wrote the same shards); only a
    /// shard that keeps changing past the attempts fails, as changed.
    #[test]
    fn a_shard_changed_while_loaded_is_loaded_again() {
        use crate::format::ShardLayout;
        use crate::store::commit::SlotChange;
        use crate::store::shard::{Shard, ShardError};
        let racing = Arc::new(Racing {
            inner: object_store::memory::InMemory::new(),
            changes: Default::default(),
        });
        let s = ObjectStoreStore::new(racing.clone(), "", "memory://racing").unwrap();
        let rel = Path::new("a/c/0");
        let data = [5u8; 4];
        s.commit_shard(rel, &level(), &mut |_| {
            vec![SlotChange {
                slot: 1,
                data: Some(&data[..]),
                closed: 1,
            }]
        })
        .unwrap();
        let layout = ShardLayout::new(vec![16], vec![16], vec![level()], Vec::new()).unwrap();
        racing.changes.store(5, std::sync::atomic::Ordering::SeqCst);
        let shard = Shard::load(&s, rel, &layout);
        let loc = layout.locate(&[1]).unwrap();
        let range = shard.chunk(&layout, &loc).unwrap().unwrap();
        assert_eq!(shard.read(range, 0, 4).unwrap(), data);
        assert_eq!(racing.changes.load(std::sync::atomic::Ordering::SeqCst), 0);
        // Changed at every attempt: the error says so.
        racing
            .changes
            .store(100, std::sync::atomic::Ordering::SeqCst);
        let shard = Shard::load(&s, rel, &layout);
        assert!(
            matches!(shard.chunk(&layout, &loc), Err(ShardError::Changed(_))),
            "{:?}",
            shard.chunk(&layout, &loc).err()
        );
    }

    /// The first chunk at the very start of the object (zarr-python's chunk 0, read first
    /// in key order): the rest comes in one piece, and every later read, the first chunk
    /// again included, is answered (a read that waited on the rest's in-flight mark, left
    /// behind when the mark and the fetch named different ranges, hung for good).
    #[test]
    fn the_first_chunk_read_again_after_the_rest_came_is_served() {
        let chunk = 64u64 << 10;
        let n = 8u64;
        let index = 16 * n + 4;
        let data: Vec<u8> = (0..(chunk * n + index) as u32)
            .map(|i| (i % 239) as u8)
            .collect();
        let s = store();
        s.write_atomically(Path::new("shard"), &data).unwrap();
        let f: Arc<dyn StoreFile> = Arc::from(s.open(Path::new("shard")).unwrap().unwrap());
        let (done, finished) = std::sync::mpsc::channel();
        let reader = {
            let (f, data) = (f.clone(), data.clone());
            std::thread::spawn(move || {
                let mut idx = vec![0u8; index as usize];
                f.read_at(&mut idx, chunk * n).unwrap();
                let mut buf = vec![0u8; chunk as usize];
                // Chunk 0, chunk 1 (the rest, one piece), chunk 0 again, every chunk, and
                // chunk 0 once more after the window was let go.
                for c in [0, 1, 0, 2, 3, 4, 5, 6, 7, 0] {
                    let range = c * chunk..(c + 1) * chunk;
                    f.read_chunk_at(&mut buf, range.start, range.clone())
                        .unwrap();
                    assert!(
                        buf[..] == data[range.start as usize..range.end as usize],
                        "{c}"
                    );
                }
                done.send(()).unwrap();
            })
        };
        // A guard against a hang, not a timing: in-memory reads take microseconds.
        finished
            .recv_timeout(Duration::from_secs(120))
            .expect("a read hung");
        reader.join().unwrap();
    }

    /// A warmed object serves its reads from one GET made before them; a warm takes at
    /// most half the read-ahead budget.
    #[test]
    fn a_warmed_object_is_read_from_one_get() {
        use std::sync::atomic::Ordering::Relaxed;
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 247) as u8).collect();
        let s = store();
        s.write_atomically(Path::new("shard"), &data).unwrap();
        let f = s.open(Path::new("shard")).unwrap().unwrap();
        f.warm();
        let mut buf = vec![0u8; 64 << 10];
        for at in (0..data.len()).step_by(buf.len()).rev() {
            f.read_at(&mut buf, at as u64).unwrap();
            assert!(buf[..] == data[at..at + buf.len()], "at {at}");
        }
        assert_eq!(s.counters().gets.load(Relaxed), 1);
        assert_eq!(s.read_ahead().0, 0, "read through: let go");
        // A warm that would take more than half the budget fetches nothing.
        let mut s = store();
        s.budget = Arc::new(Budget::new(3 << 19)); // 1.5 MiB: half is less than the object
        s.write_atomically(Path::new("shard"), &data).unwrap();
        let f = s.open(Path::new("shard")).unwrap().unwrap();
        f.warm();
        assert_eq!(s.counters().gets.load(Relaxed), 0);
        assert_eq!(s.read_ahead().0, 0);
    }

    /// The first read of a freshly opened object moves only what it asks for (a cold
    /// chunk read: the chunk, not a window).
    #[test]
    fn a_cold_read_fetches_only_what_it_asks_for() {
        use std::sync::atomic::Ordering::Relaxed;
        let s = store();
        s.write_atomically(Path::new("shard"), &vec![7u8; 1 << 20])
            .unwrap();
        let f = s.open(Path::new("shard")).unwrap().unwrap();
        let mut buf = vec![0u8; 4096];
        f.read_at(&mut buf, (1 << 20) - 4096).unwrap(); // an index at the end
        f.read_at(&mut buf, 8192).unwrap();
        assert_eq!(s.counters().gets.load(Relaxed), 2);
        assert_eq!(s.counters().get_bytes.load(Relaxed), 8192);
        // An index at the start, then the chunk right after it.
        let f = s.open(Path::new("shard")).unwrap().unwrap();
        f.read_at(&mut buf, 0).unwrap();
        f.read_at(&mut buf, 4096).unwrap();
        assert_eq!(s.counters().get_bytes.load(Relaxed), 4 * 4096);
    }

    /// Names with characters object_store escapes in keys (`~`, `#`, `%`, a space) are
    /// listed as they were made, and found after a listing (a listing showed
    /// `notes%7E`, and `stat` of `notes~` after it said there was none).
    #[test]
    fn names_with_escaped_characters_are_listed_and_found_as_made() {
        let mut s = store();
        s.meta = Arc::new(MetaCache::new(Duration::from_secs(600)));
        let names = ["notes~", "b#c", "50%", "with space"];
        for n in names {
            s.write_atomically(&Path::new("a").join(n), n.as_bytes())
                .unwrap();
        }
        s.create_dir(Path::new("a/d~")).unwrap();
        s.write_atomically(Path::new("a/d~/x"), b"x").unwrap();
        let mut listed: Vec<String> = s
            .list(Path::new("a"))
            .unwrap()
            .into_iter()
            .map(|e| e.name.into_string().unwrap())
            .collect();
        listed.sort();
        let mut want: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        want.push("d~".into());
        want.sort();
        assert_eq!(listed, want);
        for n in names {
            let m = s.stat(&Path::new("a").join(n)).unwrap();
            assert_eq!(m.map(|m| m.len), Some(n.len() as u64), "{n}");
        }
        let d = s.stat(Path::new("a/d~")).unwrap().unwrap();
        assert_eq!(d.kind, EntryKind::Dir);
        assert_eq!(s.list(Path::new("a/d~")).unwrap().len(), 1);
    }

    /// Keys another tool wrote whose parts decode to no file name (`x%2Fy` to `x/y`,
    /// `%2E` to `.`) or lead elsewhere (`raw~`: this store would ask for `raw%7E`) are
    /// listed as they are, the listing stays whole, and nothing about them is kept under
    /// another name (`.` made `a` itself look like a file).
    #[test]
    fn foreign_keys_that_decode_to_no_name_are_listed_as_they_are() {
        let mem = Arc::new(object_store::memory::InMemory::new());
        let mut s = ObjectStoreStore::new(mem.clone(), "", "memory://foreign").unwrap();
        s.meta = Arc::new(MetaCache::new(Duration::from_secs(600)));
        let put = |key: ObjPath| {
            s.block_on(mem.put(&key, PutPayload::from(b"x".to_vec())))
                .unwrap();
        };
        put(ObjPath::from("a").join("x/y")); // stored as a/x%2Fy
        put(ObjPath::from("a").join(".")); // stored as a/%2E
        put(ObjPath::parse("a/raw~").unwrap()); // as boto3 writes it
        let mut listed: Vec<String> = s
            .list(Path::new("a"))
            .unwrap()
            .into_iter()
            .map(|e| e.name.into_string().unwrap())
            .collect();
        listed.sort();
        assert_eq!(listed, ["%2E", "raw~", "x%2Fy"]);
        assert_eq!(
            s.stat(Path::new("a")).unwrap().unwrap().kind,
            EntryKind::Dir
        );
    }

    /// A fresh listing answers for the names in it and for those not in it: `stat` of a
    /// directory listed, and `stat`, `list` and `open` of a name the listing lacks, ask
    /// nothing more (`ls -lR` of an array asked a LIST and a HEAD per key directory);
    /// a write here is seen at once.
    #[test]
    fn a_listing_answers_for_the_names_below_it() {
        use std::sync::atomic::Ordering::Relaxed;
        let mem = Arc::new(object_store::memory::InMemory::new());
        let mut s = ObjectStoreStore::new(mem, "p", "memory://test").unwrap();
        s.meta = Arc::new(MetaCache::new(Duration::from_secs(600)));
        s.write_atomically(Path::new("a/c/0/0"), b"shard").unwrap();
        s.write_atomically(Path::new("a/c/1/0"), b"shard").unwrap();
        let asked = |s: &ObjectStoreStore| {
            s.counters().heads.load(Relaxed) + s.counters().lists.load(Relaxed)
        };
        assert_eq!(s.list(Path::new("a/c")).unwrap().len(), 2);
        let before = asked(&s);
        assert_eq!(
            s.stat(Path::new("a/c/0")).unwrap().unwrap().kind,
            EntryKind::Dir
        );
        assert!(s.stat(Path::new("a/c/7")).unwrap().is_none());
        let err = s.list(Path::new("a/c/7")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
        assert!(s.open(Path::new("a/c/7")).unwrap().is_none());
        assert_eq!(asked(&s), before, "answered from the listing");
        // Made here: seen at once.
        s.write_atomically(Path::new("a/c/7/0"), b"new").unwrap();
        assert_eq!(
            s.stat(Path::new("a/c/7")).unwrap().unwrap().kind,
            EntryKind::Dir
        );
        assert_eq!(s.list(Path::new("a/c/7")).unwrap().len(), 1);
    }

    /// With a TTL, what a HEAD or listing found is used again; this store's own writes
    /// and deletes are seen at once; another writer's change is seen after the TTL, or
    /// at once by the open after a read found the object changed (ESTALE).
    #[test]
    fn heads_and_listings_are_kept_for_the_ttl_and_own_writes_are_seen_at_once() {
        use std::sync::atomic::Ordering::Relaxed;
        let mem = Arc::new(object_store::memory::InMemory::new());
        let mut s = ObjectStoreStore::new(mem.clone(), "p", "memory://test").unwrap();
        s.meta = Arc::new(MetaCache::new(Duration::from_secs(600)));
        let rel = Path::new("a/c/0");
        s.write_atomically(rel, b"one").unwrap();
        let asked = |s: &ObjectStoreStore| {
            s.counters().heads.load(Relaxed) + s.counters().lists.load(Relaxed)
        };
        assert_eq!(s.stat(rel).unwrap().unwrap().len, 3);
        s.list(Path::new("a/c")).unwrap();
        let before = asked(&s);
        for _ in 0..5 {
            assert_eq!(s.stat(rel).unwrap().unwrap().len, 3);
            assert_eq!(s.list(Path::new("a/c")).unwrap().len(), 1);
            assert!(s.open(rel).unwrap().is_some());
        }
        assert_eq!(asked(&s), before, "answered from the cache");
        // Our own write and delete: seen at once.
        s.write_atomically(rel, b"four").unwrap();
        assert_eq!(s.stat(rel).unwrap().unwrap().len, 4);
        s.write_atomically(Path::new("a/c/1"), b"x").unwrap();
        assert_eq!(s.list(Path::new("a/c")).unwrap().len(), 2);
        s.remove_file(Path::new("a/c/1")).unwrap();
        assert_eq!(s.list(Path::new("a/c")).unwrap().len(), 1);
        assert!(s.stat(Path::new("a/c/1")).unwrap().is_none());
        // Another writer: an open file of the old version reads ESTALE, and the next
        // open sees the new version without waiting for the TTL.
        let f = s.open(rel).unwrap().unwrap();
        let key = ObjPath::from("p/a/c/0");
        s.block_on(mem.put(&key, PutPayload::from(b"other!".to_vec())))
            .unwrap();
        let mut buf = [0u8; 4];
        let err = f.read_at(&mut buf, 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ESTALE));
        assert_eq!(s.stat(rel).unwrap().unwrap().len, 6);
        // A change nobody here read: seen once the TTL has passed.
        s.block_on(mem.put(&key, PutPayload::from(b"seventh".to_vec())))
            .unwrap();
        assert_eq!(s.stat(rel).unwrap().unwrap().len, 6, "within the TTL");
        s.meta = Arc::new(MetaCache::new(Duration::from_millis(50)));
        assert_eq!(s.stat(rel).unwrap().unwrap().len, 7);
        s.block_on(mem.put(&key, PutPayload::from(b"eighth!!".to_vec())))
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(s.stat(rel).unwrap().unwrap().len, 8, "after the TTL");
    }
}
