//! [`FaultyStore`], a test tool: it wraps any [`Store`] and makes chosen calls fail
//! with an errno. Nothing outside tests uses it. It is modelled on mountpoint-s3's
//! failure client, which wraps any `ObjectClient`.
//!
//! A [`Fault`] is a rule. It names an operation ([`Op`]), optionally a path
//! ([`PathMatch`]), which of the matching calls fail ([`When`]) and the errno they fail
//! with. A failing call fails *before* it reaches the wrapped store, so it changes
//! nothing. The files that `open`, `open_with` and `open_rw` return are wrapped too, so
//! reads, writes and syncs of open files can fail as well. Rules can be injected and
//! removed at any time. Each rule counts the calls it matched and the ones it failed, so
//! a test can check that its fault really fired.
//!
//! What it does not do:
//! * Tear a write part-way. How far a cut shard write gets depends on how the store
//!   writes a shard, so that fault stays with the store: [`super::MemoryStore::cut_commit`].
//! * Fail the calls a store makes to itself. For example, a writable [`super::LocalStore`]'s
//!   recovery reads its directory directly, so no fault reaches it.
//! * Fail `warm`. It is best effort anyway: the read that later needs the bytes meets
//!   the fault.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::commit::{CommitError, CommitOutcome, Merge};
use super::{
    Capabilities, EntryMeta, ListEntry, OpenMode, Prefetch, ReadLock, SpaceInfo, Store, StoreFile,
    StoreFileRw,
};
use crate::format::ShardLevel;

/// The operation a [`Fault`] fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `stat`, and `meta` of an open file.
    Stat,
    List,
    /// `open`, `open_with`, `open_rw`, and the open of `read_all`.
    Open,
    /// Reads of an open file, and the read of `read_all`.
    Read,
    ReadLink,
    Space,
    /// `write_all_at` and `set_len` of a file open for writing.
    Write,
    /// `sync` of an open file, and `sync_file`.
    Sync,
    /// `commit_shard` and `rewrite_dense`: any change to a shard.
    Commit,
    WriteAtomically,
    CreateDir,
    /// `remove_file` and `remove_dir`.
    Remove,
    /// `rename` (of a file, or of a directory where the store renames them).
    Rename,
    HardLink,
    SetModeOwner,
}

/// Which paths a [`Fault`] matches. A call with two paths (a rename, a link) matches if
/// either of them does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathMatch {
    Any,
    /// The path itself, or anything below it (whole components: `a/c/1` does not
    /// match `a/c/10`).
    Under(PathBuf),
    /// Any path whose text contains this string (`"zarr.json"`, `".shardfs-tmp"`).
    Contains(String),
}

impl PathMatch {
    fn matches(&self, path: &Path) -> bool {
        match self {
            PathMatch::Any => true,
            PathMatch::Under(p) => path.starts_with(p),
            PathMatch::Contains(s) => path.to_string_lossy().contains(s.as_str()),
        }
    }
}

/// Which of a rule's matching calls fail. Calls are counted from 0, starting when the
/// rule is injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// Only the `n`th one (0 is the next one).
    Nth(usize),
    /// The `n`th one and every later one (`From(0)`: all of them).
    From(usize),
}

/// A rule: calls of `op` on paths that match `path`, selected by `when`, fail with
/// `errno`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub op: Op,
    pub path: PathMatch,
    pub when: When,
    pub errno: i32,
}

impl Fault {
    /// Every call of `op` fails with `errno`. The builder methods below narrow it.
    pub fn new(op: Op, errno: i32) -> Self {
        Fault {
            op,
            path: PathMatch::Any,
            when: When::From(0),
            errno,
        }
    }

    pub fn under(mut self, path: impl Into<PathBuf>) -> Self {
        self.path = PathMatch::Under(path.into());
        self
    }

    pub fn containing(mut self, text: impl Into<String>) -> Self {
        self.path = PathMatch::Contains(text.into());
        self
    }

    pub fn nth(mut self, n: usize) -> Self {
        self.when = When::Nth(n);
        self
    }

    pub fn from_nth(mut self, n: usize) -> Self {
        self.when = When::From(n);
        self
    }
}

/// Names an injected rule, so its counters can be read and the rule removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultId(usize);

struct Rule {
    fault: Fault,
    active: bool,
    /// Calls matched since injection.
    seen: usize,
    /// Calls it was due to fail (each of them failed).
    fired: usize,
}

/// The rules, shared by the store and the files it opened.
#[derive(Default)]
struct Rules(Mutex<Vec<Rule>>);

impl Rules {
    /// Fail this call if a rule says so. Every active rule that matches counts the
    /// call, and every one whose turn it is counts it as failed; the errno is that of
    /// the first of those (in the order they were injected).
    fn check(&self, op: Op, paths: &[&Path]) -> io::Result<()> {
        let mut errno = None;
        for rule in self.0.lock().iter_mut() {
            let f = &rule.fault;
            if !rule.active || f.op != op || !paths.iter().any(|p| f.path.matches(p)) {
                continue;
            }
            let n = rule.seen;
            rule.seen += 1;
            let due = match f.when {
                When::Nth(k) => n == k,
                When::From(k) => n >= k,
            };
            if due {
                rule.fired += 1;
                errno = errno.or(Some(f.errno));
            }
        }
        errno.map_or(Ok(()), |e| Err(io::Error::from_raw_os_error(e)))
    }
}

/// A store whose calls fail when a rule says so (see the module documentation).
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    rules: Arc<Rules>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        FaultyStore {
            inner,
            rules: Arc::default(),
        }
    }

    pub fn inject(&self, fault: Fault) -> FaultId {
        let mut rules = self.rules.0.lock();
        rules.push(Rule {
            fault,
            active: true,
            seen: 0,
            fired: 0,
        });
        FaultId(rules.len() - 1)
    }

    /// Stop one rule. Its counters stay readable.
    pub fn remove(&self, id: FaultId) {
        if let Some(rule) = self.rules.0.lock().get_mut(id.0) {
            rule.active = false;
        }
    }

    /// Stop every rule. Their counters stay readable.
    pub fn clear(&self) {
        for rule in self.rules.0.lock().iter_mut() {
            rule.active = false;
        }
    }

    /// Calls the rule matched while it was active.
    pub fn seen(&self, id: FaultId) -> usize {
        self.rules.0.lock().get(id.0).map_or(0, |r| r.seen)
    }

    /// Calls the rule was due to fail, each of which failed (with the errno of the
    /// first-injected rule due, where several were).
    pub fn fired(&self, id: FaultId) -> usize {
        self.rules.0.lock().get(id.0).map_or(0, |r| r.fired)
    }

    fn check(&self, op: Op, path: &Path) -> io::Result<()> {
        self.rules.check(op, &[path])
    }

    /// A shard commit's check: its error is the commit's, as a store's would be.
    fn check_commit(&self, rel: &Path) -> Result<(), CommitError> {
        let path = rel.to_path_buf();
        self.check(Op::Commit, rel)
            .map_err(|source| CommitError::Io { path, source })
    }

    fn wrap(&self, rel: &Path, file: Option<Box<dyn StoreFile>>) -> Option<Box<dyn StoreFile>> {
        let rules = self.rules.clone();
        file.map(|inner| Box::new(FaultyFile::new(inner, rel, rules)) as Box<dyn StoreFile>)
    }
}

/// A file opened through a [`FaultyStore`]: its reads, writes and syncs obey the rules.
struct FaultyFile<F: ?Sized> {
    path: PathBuf,
    rules: Arc<Rules>,
    inner: Box<F>,
}

impl<F: ?Sized> FaultyFile<F> {
    fn new(inner: Box<F>, rel: &Path, rules: Arc<Rules>) -> Self {
        FaultyFile {
            path: rel.to_path_buf(),
            rules,
            inner,
        }
    }

    fn check(&self, op: Op) -> io::Result<()> {
        self.rules.check(op, &[&self.path])
    }
}

impl<F: StoreFile + ?Sized> StoreFile for FaultyFile<F> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.check(Op::Read)?;
        self.inner.read_at(buf, offset)
    }

    fn meta(&self) -> io::Result<EntryMeta> {
        self.check(Op::Stat)?;
        self.inner.meta()
    }

    fn read_chunk_at(
        &self,
        buf: &mut [u8],
        offset: u64,
        chunk: std::ops::Range<u64>,
    ) -> io::Result<usize> {
        self.check(Op::Read)?;
        self.inner.read_chunk_at(buf, offset, chunk)
    }

    fn streaming(&self) -> bool {
        self.inner.streaming()
    }

    fn cold(&self) -> bool {
        self.inner.cold()
    }

    fn pass(&self) -> u64 {
        self.inner.pass()
    }

    fn warm(&self) {
        self.inner.warm()
    }

    fn claim_rest(&self, skip: std::ops::Range<u64>) -> bool {
        self.inner.claim_rest(skip)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(Op::Read)?;
        self.inner.read_exact_at(buf, offset)
    }
}

impl StoreFileRw for FaultyFile<dyn StoreFileRw> {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check(Op::Write)?;
        self.inner.write_all_at(buf, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.check(Op::Write)?;
        self.inner.set_len(len)
    }

    fn sync(&self) -> io::Result<()> {
        self.check(Op::Sync)?;
        self.inner.sync()
    }
}

/// Every method is forwarded after its rule check, including those with a default, so
/// that the wrapped store's own way of doing them is kept. [`super::remove_tree`], no
/// method, runs through this wrapper's `stat`, `list` and removals, so faults reach each
/// step.
impl Store for FaultyStore {
    fn stat(&self, rel: &Path) -> io::Result<Option<EntryMeta>> {
        self.check(Op::Stat, rel)?;
        self.inner.stat(rel)
    }

    fn list(&self, rel: &Path) -> io::Result<Vec<ListEntry>> {
        self.check(Op::List, rel)?;
        self.inner.list(rel)
    }

    // Forwarded, as every method is (before, it fell back to the default, so an object
    // store wrapped here never took its one-LIST listing of a tree). Not a fault point
    // of its own: the listings it answers are `list`'s, which are.
    fn list_tree(&self, rel: &Path, max: usize) -> io::Result<bool> {
        self.inner.list_tree(rel, max)
    }

    fn open(&self, rel: &Path) -> io::Result<Option<Box<dyn StoreFile>>> {
        self.check(Op::Open, rel)?;
        Ok(self.wrap(rel, self.inner.open(rel)?))
    }

    fn open_with(&self, rel: &Path, with: Prefetch) -> io::Result<Option<Box<dyn StoreFile>>> {
        self.check(Op::Open, rel)?;
        Ok(self.wrap(rel, self.inner.open_with(rel, with)?))
    }

    fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        self.check(Op::ReadLink, rel)?;
        self.inner.read_link(rel)
    }

    fn space(&self) -> io::Result<SpaceInfo> {
        self.check(Op::Space, Path::new(""))?;
        self.inner.space()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    /// The wrapped store's. Where it is [`super::Commits::Append`], the view's
    /// [`super::local::AppendRecords::load_hook`] is given the store the view holds, this
    /// wrapper: a hook that reads through it (a read-only local store's reader of
    /// recovery records) meets the faults too.
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn requests(&self) -> Vec<(&'static str, u64)> {
        self.inner.requests()
    }

    fn read_lock(&self, dir: &Path) -> Option<ReadLock> {
        self.inner.read_lock(dir)
    }

    fn rewrite_dense(
        &self,
        rel: &Path,
        level: &ShardLevel,
    ) -> Result<Option<(u64, u64)>, CommitError> {
        self.check_commit(rel)?;
        self.inner.rewrite_dense(rel, level)
    }

    fn commit_shard(
        &self,
        rel: &Path,
        level: &ShardLevel,
        merge: &mut Merge<'_, '_>,
    ) -> Result<CommitOutcome, CommitError> {
        self.check_commit(rel)?;
        let mut outcome = self.inner.commit_shard(rel, level, merge)?;
        // Read through this store, as a load's file is: its rules apply to it.
        if let Some(stored) = &mut outcome.stored {
            stored.file = self.wrap(rel, stored.file.take());
        }
        Ok(outcome)
    }

    fn open_rw(
        &self,
        rel: &Path,
        mode: OpenMode,
        truncate: bool,
    ) -> io::Result<Box<dyn StoreFileRw>> {
        self.check(Op::Open, rel)?;
        let inner = self.inner.open_rw(rel, mode, truncate)?;
        Ok(Box::new(FaultyFile::new(inner, rel, self.rules.clone())))
    }

    fn write_atomically(&self, rel: &Path, data: &[u8]) -> io::Result<()> {
        self.check(Op::WriteAtomically, rel)?;
        self.inner.write_atomically(rel, data)
    }

    fn create_dir(&self, rel: &Path) -> io::Result<()> {
        self.check(Op::CreateDir, rel)?;
        self.inner.create_dir(rel)
    }

    fn remove_file(&self, rel: &Path) -> io::Result<()> {
        self.check(Op::Remove, rel)?;
        self.inner.remove_file(rel)
    }

    fn remove_dir(&self, rel: &Path) -> io::Result<()> {
        self.check(Op::Remove, rel)?;
        self.inner.remove_dir(rel)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.rules.check(Op::Rename, &[from, to])?;
        self.inner.rename(from, to)
    }

    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.rules.check(Op::HardLink, &[from, to])?;
        self.inner.hard_link(from, to)
    }

    fn set_mode_owner(
        &self,
        rel: &Path,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> io::Result<()> {
        self.check(Op::SetModeOwner, rel)?;
        self.inner.set_mode_owner(rel, mode, uid, gid)
    }

    fn sync_file(&self, rel: &Path) -> io::Result<()> {
        self.check(Op::Sync, rel)?;
        self.inner.sync_file(rel)
    }

    fn read_all(&self, rel: &Path) -> io::Result<Option<Vec<u8>>> {
        self.check(Op::Open, rel)?;
        self.check(Op::Read, rel)?;
        self.inner.read_all(rel)
    }
}
