//! Requests to the object store, each under the deadline of `--s3-timeout` (the deadline
//! and the failures in words and as errnos: `deadline.rs`).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io;
use std::path::{Component, Path};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use object_store::path::Path as ObjPath;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};

use super::BucketStore;
pub(super) use super::deadline::{Deadline, ObjResult, answered, describe_error, timed, to_io};
use super::meta::{LISTED_HEADS, name_of};
use crate::store::{EntryKind, EntryMeta, ListEntry};

impl BucketStore {
    pub(super) fn key(&self, rel: &Path) -> io::Result<ObjPath> {
        let mut key = self.prefix.clone();
        for c in rel.components() {
            match c {
                Component::Normal(part) => {
                    let part = part.to_str().ok_or_else(|| {
                        io::Error::new(io::ErrorKind::InvalidInput, "a name that is not UTF-8")
                    })?;
                    let part = super::meta::key_part(part).ok_or_else(|| {
                        io::Error::new(
                            io::ErrorKind::InvalidInput,
                            "a name with an ASCII control character: no S3 key",
                        )
                    })?;
                    key = key.join(part);
                }
                Component::CurDir => {}
                _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
            }
        }
        Ok(key)
    }

    pub(super) fn block_on<T>(&self, f: impl Future<Output = ObjResult<T>>) -> ObjResult<T> {
        self.deadline.run(self.rt.handle(), f)
    }

    pub(super) fn head(&self, rel: &Path) -> io::Result<Option<object_store::ObjectMeta>> {
        if rel.as_os_str().is_empty() {
            return Ok(None);
        }
        // While the endpoint does not answer, what was known before, however old: the
        // names and sizes of files whose pages the kernel or a window holds (issue 34:
        // "what needs no S3 answers at once during an outage").
        if let Some(known) = self
            .meta
            .usable(&self.meta.heads, rel, self.deadline.outage())
        {
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
            // No answer: what was known before, however old.
            Err(e)
                if !answered(&Err::<(), _>(&e))
                    && let Some(held) = self.meta.held(&self.meta.heads, rel) =>
            {
                log::debug!("{}: no answer ({e}): as before", rel.display());
                return Ok(held);
            }
            Err(e) => return Err(to_io(rel, e)),
        };
        self.meta
            .keep(&self.meta.heads, rel, found.clone(), generation);
        Ok(found)
    }

    pub(super) fn put(&self, rel: &Path, data: Vec<u8>, mode: PutMode) -> io::Result<()> {
        self.put_answered(rel, data, mode).map(|_| ())
    }

    /// [`Self::put`], with the PUT's answer: the new version's ETag (and version id).
    pub(super) fn put_answered(
        &self,
        rel: &Path,
        data: Vec<u8>,
        mode: PutMode,
    ) -> io::Result<object_store::PutResult> {
        let key = self.key(rel)?;
        let opts = PutOptions {
            mode,
            ..Default::default()
        };
        let put = self.block_on(self.inner.put_opts(&key, PutPayload::from(data), opts));
        // Whatever happened (a lost race says the object changed), ask next time.
        self.meta.forget(rel);
        let answer = put.map_err(|e| to_io(rel, e))?;
        let mut dirs = self.dirs.lock();
        for d in rel.ancestors().skip(1) {
            dirs.remove(d);
        }
        Ok(answer)
    }

    /// The whole object and its version; `None` when there is none.
    pub(super) fn get_versioned(&self, rel: &Path) -> io::Result<Option<(Vec<u8>, UpdateVersion)>> {
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

/// Metadata files are opened with one GET of their first this many bytes (all of any
/// metadata file but a huge consolidated one), not a HEAD and then a GET.
pub(super) const METADATA_PREFIX: u64 = 1 << 20;

impl BucketStore {
    /// The object at `rel` and its bytes in `range`, in one request (what a HEAD would
    /// say is kept as its answer); `None` when there is none.
    pub(super) fn get_range(
        &self,
        rel: &Path,
        range: object_store::GetRange,
    ) -> io::Result<Option<(object_store::ObjectMeta, bytes::Bytes)>> {
        let key = self.key(rel)?;
        let generation = self.meta.generation();
        self.counters
            .gets
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        log::debug!("GET {key} bytes {range} (opened)");
        let got = self.block_on(async {
            let opts = object_store::GetOptions {
                range: Some(range),
                ..Default::default()
            };
            let r = self.inner.get_opts(&key, opts).await?;
            let meta = r.meta.clone();
            Ok::<_, object_store::Error>((meta, r.bytes().await?))
        });
        let found = match got {
            Ok((meta, bytes)) => {
                self.counters
                    .get_bytes
                    .fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
                Some((meta, bytes))
            }
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => return Err(to_io(rel, e)),
        };
        let head = found.as_ref().map(|(m, _)| m.clone());
        self.meta.keep(&self.meta.heads, rel, head, generation);
        Ok(found)
    }
}

/// Whether `rel` names a Zarr metadata file, or the document an unlink keeps
/// ([`crate::store::UNLINKED_META`]): read whole, and small (opened with one GET).
pub(super) fn is_metadata(rel: &Path) -> bool {
    rel.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
        matches!(
            n,
            "zarr.json" | ".zarray" | ".zattrs" | ".zgroup" | ".zmetadata"
        ) || n == crate::store::UNLINKED_META
    })
}

pub(super) fn meta_of(m: &object_store::ObjectMeta) -> EntryMeta {
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
    let tag = h.finish();
    // Whole seconds (a HEAD's precision), and nanoseconds from the ETag: an object
    // replaced within the same second by one of the same length then shows another
    // mtime, which is what the kernel compares before it drops its cached pages of the
    // file. Before, such a change went unseen by a mount for as long as the kernel kept
    // the pages, long past the TTL (found by an adversarial tester).
    let mtime = SystemTime::UNIX_EPOCH
        + Duration::new(
            u64::try_from(m.last_modified.timestamp()).unwrap_or(0),
            (tag % 1_000_000_000) as u32,
        );
    EntryMeta {
        kind: EntryKind::File,
        len: m.size,
        mtime,
        ctime: mtime,
        perm: 0o644,
        uid: 0,
        gid: 0,
        // The ETag: with the length, tells when an object was replaced (with the time
        // too where there is no ETag).
        ino: tag >> 1,
        content_id: m.e_tag.as_deref().is_some_and(names_contents),
    }
}

/// Whether an ETag names an object's contents: any but an empty one (some S3-compatible
/// gateways send `""` for every object), which tells no version from another.
pub(super) fn names_contents(e_tag: &str) -> bool {
    !e_tag.trim_matches('"').is_empty()
}

pub(super) fn dir_meta() -> EntryMeta {
    EntryMeta {
        kind: EntryKind::Dir,
        len: 0,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        perm: 0o755,
        uid: 0,
        gid: 0,
        ino: 1,
        content_id: false,
    }
}

/// The S3 client for `bucket`: configured from the `AWS_*` environment, as object_store
/// reads it, and from the profile (`aws.rs`) for what the environment lacks; every
/// request retried until `opts.timeout`. An endpoint that would make object_store panic
/// or refuse (plain http without `AWS_ALLOW_HTTP`) is said in words.
pub(super) fn s3(
    bucket: &str,
    opts: &super::S3Options,
    profile: super::aws::Profile,
) -> Result<object_store::aws::AmazonS3, String> {
    // object_store panics on an endpoint that is not an absolute URL: say so first.
    for var in ["AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3"] {
        if let Ok(v) = std::env::var(var)
            && !(v.starts_with("http://") || v.starts_with("https://"))
        {
            return Err(format!("{var}={v:?} is not an http:// or https:// URL"));
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
            return Err(format!(
                "{var}={v:?} is plain http: set AWS_ALLOW_HTTP=true to use it"
            ));
        }
    }
    let mut builder = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        // Retried until --s3-timeout, however many tries that takes (10 tries, the
        // default, were spent in 2-4 s on refused connections), at most 2 s apart:
        // the first request after an outage ends finds the endpoint soon.
        .with_retry(object_store::RetryConfig {
            backoff: object_store::BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: usize::MAX,
            retry_timeout: opts.timeout,
        });
    // Each HTTP request (a listing's pages each) gives up after --s3-timeout too: a
    // listing runs under this alone, not under one deadline for all its pages.
    let ms = |d: Duration| format!("{}ms", d.as_millis().max(1));
    builder = builder
        .with_config(
            object_store::aws::AmazonS3ConfigKey::Client(object_store::ClientConfigKey::Timeout),
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
    if let Some(region) = profile.region {
        builder = builder.with_region(region);
    }
    // The profile's `endpoint_url`, written there on purpose: plain http too.
    if let Some(endpoint) = profile.endpoint {
        builder = builder
            .with_allow_http(endpoint.starts_with("http://"))
            .with_endpoint(endpoint);
    }
    if let Some(credentials) = profile.credentials {
        builder = builder.with_credentials(credentials);
    }
    builder.build().map_err(|e| e.to_string())
}

impl BucketStore {
    /// A LIST (one request per page of 1,000 names), its answer kept in the metadata
    /// cache ([`super::meta`]) for the HEADs and listings it answers.
    /// The objects and common prefixes right below `rel`, as names.
    /// And the cache generation it was asked at (for keeping the listing).
    pub(super) fn list_objects(&self, rel: &Path) -> io::Result<(Vec<ListEntry>, u64)> {
        let generation = self.meta.generation();
        self.counters
            .lists
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = self.key(rel)?;
        log::debug!("LIST {key}/");
        // A request per page of 1,000 names, all within the operation's allowance (at
        // 30 ms a page, 1,000 pages in the default 30 s).
        let l = self
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
}

impl BucketStore {
    /// [`crate::store::Store::list_tree`]: one LIST of every key below `rel` (no
    /// delimiter), of at most `max` (under 1,000: one page); where they all came, the
    /// listing of `rel` and of every directory below it, and the HEAD answers of the
    /// objects in them, are kept as their own LISTs' would be (for the TTL, not past a
    /// forget since it was asked). `false`: nothing kept (more keys, a key that is no
    /// name, or no TTL to keep anything for).
    pub(super) fn tree(&self, rel: &Path, max: usize) -> io::Result<bool> {
        if self.meta.ttl.is_zero() || self.deadline.outage() {
            return Ok(false);
        }
        let generation = self.meta.generation();
        self.counters
            .lists
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = self.key(rel)?;
        log::debug!("LIST {key}/ (all below, at most {max})");
        let max = max.min(999);
        let objects = self
            .block_on(async {
                let mut stream = self.inner.list(Some(&key));
                let mut out = Vec::new();
                while let Some(o) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
                    out.push(o?);
                    if out.len() > max {
                        break;
                    }
                }
                Ok(out)
            })
            .map_err(|e| to_io(rel, e))?;
        if objects.len() > max {
            return Ok(false);
        }
        let Some(dirs) = by_directory(rel, &key, &objects) else {
            return Ok(false);
        };
        for (dir, (entries, objects)) in &dirs {
            let listed: Vec<ListEntry> = entries
                .iter()
                .map(|(name, kind)| ListEntry {
                    name: OsString::from(name),
                    kind: *kind,
                })
                .collect();
            let dir_key = self.key(dir)?;
            self.keep_listed_heads(dir, &dir_key, objects, generation);
            let files: BTreeSet<String> = objects
                .iter()
                .filter_map(|o| name_of(&o.location).map(|(n, _)| n))
                .collect();
            for (name, kind) in entries {
                if *kind == EntryKind::Dir && !files.contains(name) {
                    let below = dir.join(name);
                    self.meta.keep(&self.meta.heads, &below, None, generation);
                }
            }
            self.meta
                .keep(&self.meta.children, dir, !listed.is_empty(), generation);
            self.meta
                .keep(&self.meta.listings, dir, Arc::new(listed), generation);
        }
        Ok(true)
    }
}

/// A directory's entries (a name both an object and a directory: listed as a
/// directory, as a LIST with a delimiter lists it) and the objects in it.
type ListedDir = (
    std::collections::BTreeMap<String, EntryKind>,
    Vec<object_store::ObjectMeta>,
);

/// The objects of a LIST of every key below `rel` (`key`), by directory: `rel` and every
/// directory below it. `None` where a key is no name this store would reach by that
/// key (listed by levels then, as `list_objects` lists it).
fn by_directory(
    rel: &Path,
    key: &ObjPath,
    objects: &[object_store::ObjectMeta],
) -> Option<std::collections::BTreeMap<std::path::PathBuf, ListedDir>> {
    let mut dirs: std::collections::BTreeMap<std::path::PathBuf, ListedDir> = Default::default();
    dirs.entry(rel.to_path_buf()).or_default();
    let depth = key.parts().count();
    for o in objects {
        let parts: Vec<String> = o.location.parts().map(|p| p.as_ref().to_string()).collect();
        if parts.len() <= depth || !o.location.prefix_matches(key) {
            continue; // the key itself
        }
        let parts = &parts[depth..];
        if parts.iter().any(|p| {
            !super::meta::is_file_name(p)
                || super::meta::key_part(p).is_none_or(|k| k.as_ref() != p)
        }) {
            return None;
        }
        let mut dir = rel.to_path_buf();
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let entry = dirs.entry(dir.clone()).or_default();
            if last {
                entry.0.entry(part.to_string()).or_insert(EntryKind::File);
                entry.1.push(o.clone());
            } else {
                entry.0.insert(part.to_string(), EntryKind::Dir);
            }
            dir.push(part);
        }
    }
    Some(dirs)
}
