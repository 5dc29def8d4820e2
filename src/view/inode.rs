//! Inode numbers for the virtual tree: a path ↔ inode table with kernel lookup counts.
//!
//! An inode lives from the first `lookup` that returns it until the kernel `forget`s it
//! as often as it looked it up. Its number is a hash of its path and kind
//! ([`stable_ino`]), so a path the kernel forgot and looks up again gets the number it had
//! (tools compare `lstat` with `fstat` of the opened file, as Python's `shutil.rmtree`
//! does, and the kernel may forget an inode between the two), and `readdir` shows the
//! number `stat` will. Only when that number is taken by another live inode (an unlinked
//! file still open, a renamed inode, a hash collision) is a number handed out from a
//! counter, which never meets a hashed one (their top bit is clear); that path then keeps
//! the counter's number (also after the kernel forgets it, and after the inode that held
//! its hash is gone), so a path that is not changed never changes its number.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use parking_lot::RwLock;

use super::node::{Kind, Node};

pub const ROOT_INO: u64 = 1;

/// The inode number `path` gets as a `kind` when that number is free: a hash with the top
/// bit set. Stable for the life of the process.
///
/// A name that is a number below [`ORDERED_NAMES`] (a chunk file or key directory: `c/3/7`)
/// gets its parent's hash with that number in the low bits, so the names of one directory
/// number in key order. GNU `cp -r` and `rsync` read a directory's files in inode order
/// (to spare a disk's seeks); with hashed numbers they read the chunk files of an array in
/// random order, defeating read-ahead by shard, which follows key order (issue 34).
pub fn stable_ino(path: &Path, kind: Kind) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (kind as u8).hash(&mut h);
    let ordered = path
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| n.bytes().all(|b| b.is_ascii_digit()) && (!n.starts_with('0') || *n == "0"))
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|&n| n < ORDERED_NAMES);
    match (ordered, path.parent()) {
        (Some(n), Some(parent)) => {
            parent.hash(&mut h);
            (h.finish() & !(ORDERED_NAMES - 1)) | n | (1 << 63)
        }
        _ => {
            path.hash(&mut h);
            h.finish() | (1 << 63)
        }
    }
}

/// Numeric names below this number in order ([`stable_ino`]).
const ORDERED_NAMES: u64 = 1 << 20;

struct Entry {
    path: PathBuf,
    node: Node,
    lookups: u64,
    /// Handles open on it ([`InodeTable::hold`]): an inode the kernel forgot lives on
    /// while it has any, so its number is not handed to another file. The kernel sends
    /// a forget before a release still queued for the same inode (forgets jump the
    /// queue), and a file created at that moment must not be taken for the released one.
    handles: u32,
    /// No longer what it was ([`InodeTable::retire`]): every request for it is refused
    /// as stale until the kernel forgets it.
    retired: bool,
}

struct Inner {
    by_path: HashMap<PathBuf, u64>,
    by_ino: HashMap<u64, Entry>,
    next: u64,
    /// Numbers from the counter, by the path (and kind) they were given to: what that
    /// path gets again while the number is free.
    counted: HashMap<(PathBuf, Kind), u64>,
}

impl Inner {
    /// The number `path` gets as a `kind` when that number is free.
    fn number_for(&self, path: &Path, kind: Kind) -> u64 {
        self.counted
            .get(&(path.to_path_buf(), kind))
            .copied()
            .unwrap_or_else(|| stable_ino(path, kind))
    }
}

pub struct InodeTable {
    inner: RwLock<Inner>,
}

impl InodeTable {
    pub fn new(root: Node) -> Self {
        let mut by_ino = HashMap::new();
        by_ino.insert(
            ROOT_INO,
            Entry {
                path: PathBuf::new(),
                node: root,
                lookups: 1,
                handles: 0,
                retired: false,
            },
        );
        let mut by_path = HashMap::new();
        by_path.insert(PathBuf::new(), ROOT_INO);
        InodeTable {
            inner: RwLock::new(Inner {
                by_path,
                by_ino,
                next: ROOT_INO + 1,
                counted: HashMap::new(),
            }),
        }
    }

    /// The virtual path and node of `ino`.
    pub fn get(&self, ino: u64) -> Option<(PathBuf, Node)> {
        self.inner
            .read()
            .by_ino
            .get(&ino)
            .filter(|e| !e.retired)
            .map(|e| (e.path.clone(), e.node.clone()))
    }

    /// The virtual path and node of `ino`, also when it is retired.
    pub fn get_any(&self, ino: u64) -> Option<(PathBuf, Node)> {
        self.inner
            .read()
            .by_ino
            .get(&ino)
            .map(|e| (e.path.clone(), e.node.clone()))
    }

    /// Whether the kernel may still hold an inode for `path`: one names it now, or one
    /// retired at it lives on.
    pub fn known(&self, path: &Path) -> bool {
        let inner = self.inner.read();
        inner.by_path.contains_key(path)
            || inner.by_ino.values().any(|e| e.retired && e.path == path)
    }

    /// The inode already given to `path`, if any.
    pub fn peek(&self, path: &Path) -> Option<u64> {
        self.inner.read().by_path.get(path).copied()
    }

    /// The number `stat` of `path` (a `kind`) shows (for `readdir`'s `d_ino`): the inode's
    /// it has, or the number a lookup would give it.
    pub fn number(&self, path: &Path, kind: Kind) -> u64 {
        {
            let inner = self.inner.read();
            if let Some(&ino) = inner.by_path.get(path) {
                return ino;
            }
            let wanted = inner.number_for(path, kind);
            if !inner.by_ino.contains_key(&wanted) {
                return wanted;
            }
        }
        // Its number is another live inode's (numbered names of two directories share
        // their parent's hash in all but 20 bits, so this is not as rare as with whole
        // hashes): the counter's number now, kept for the path, so that its lookup
        // gives the number this listing shows.
        let mut inner = self.inner.write();
        if let Some(&ino) = inner.by_path.get(path) {
            return ino;
        }
        let wanted = inner.number_for(path, kind);
        if !inner.by_ino.contains_key(&wanted) {
            return wanted;
        }
        let ino = inner.next;
        inner.next += 1;
        inner.counted.insert((path.to_path_buf(), kind), ino);
        ino
    }

    /// Give `path` an inode for `node` and count one kernel lookup. A path whose node
    /// changed kind (a file became a directory) gets another inode.
    pub fn intern(&self, path: PathBuf, node: Node) -> u64 {
        let mut inner = self.inner.write();
        if let Some(&ino) = inner.by_path.get(&path) {
            let e = inner
                .by_ino
                .get_mut(&ino)
                .expect("by_path and by_ino agree");
            if e.node.kind() == node.kind() {
                e.node = node;
                e.lookups += 1;
                return ino;
            }
        }
        let kind = node.kind();
        let wanted = inner.number_for(&path, kind);
        let ino = if inner.by_ino.contains_key(&wanted) {
            let ino = inner.next;
            inner.next += 1;
            inner.counted.insert((path.clone(), kind), ino);
            ino
        } else {
            wanted
        };
        inner.by_path.insert(path.clone(), ino);
        inner.by_ino.insert(
            ino,
            Entry {
                path,
                node,
                lookups: 1,
                handles: 0,
                retired: false,
            },
        );
        ino
    }

    /// Replace the node of a known inode (after its metadata changed).
    pub fn update(&self, ino: u64, node: Node) {
        if let Some(e) = self.inner.write().by_ino.get_mut(&ino) {
            e.node = node;
        }
    }

    /// Replace the node of whatever inode `path` has now.
    pub fn update_path(&self, path: &Path, node: Node) {
        let mut inner = self.inner.write();
        if let Some(&ino) = inner.by_path.get(path)
            && let Some(e) = inner.by_ino.get_mut(&ino)
        {
            e.node = node;
        }
    }

    /// `path` no longer names its inode (unlinked); the inode lives until forgotten.
    pub fn detach(&self, path: &Path) {
        self.inner.write().by_path.remove(path);
    }

    /// The inode at `from` now lives at `to` as `node` (a rename); whatever was at `to`
    /// is detached.
    pub fn rename(&self, from: &Path, to: PathBuf, node: Node) {
        let mut inner = self.inner.write();
        let Some(ino) = inner.by_path.remove(from) else {
            return;
        };
        inner.by_path.insert(to.clone(), ino);
        if let Some(e) = inner.by_ino.get_mut(&ino) {
            e.path = to;
            e.node = node;
        }
    }

    /// The directory at `from` and everything below it now live at `to` (a directory
    /// renamed); whatever was at or below `to` is detached. Nodes stay as they were:
    /// the caller looks them up again at their new paths.
    pub fn move_tree(&self, from: &Path, to: &Path) {
        let mut inner = self.inner.write();
        inner.by_path.retain(|p, _| !p.starts_with(to));
        let moved: Vec<(PathBuf, u64)> = inner
            .by_path
            .iter()
            .filter(|(p, _)| p.starts_with(from))
            .map(|(p, &i)| (p.clone(), i))
            .collect();
        for (old, ino) in moved {
            inner.by_path.remove(&old);
            let new = to.join(old.strip_prefix(from).expect("below from"));
            if let Some(e) = inner.by_ino.get_mut(&ino) {
                e.path = new.clone();
            }
            inner.by_path.insert(new, ino);
        }
    }

    /// `ino` is no longer what its path names (the store changed under it: a plain file
    /// at a chunk key taken into a new array, whose shard may now have the file's path).
    /// Its path is free for another inode, and every request for it gets `None` (the
    /// kernel is told it is stale, and looks the name up again): none may reach what its
    /// node pointed at. It lives until the kernel forgets it.
    pub fn retire(&self, ino: u64) {
        if ino == ROOT_INO {
            return;
        }
        let mut inner = self.inner.write();
        let Some(e) = inner.by_ino.get_mut(&ino) else {
            return;
        };
        e.retired = true;
        let path = e.path.clone();
        if inner.by_path.get(&path) == Some(&ino) {
            inner.by_path.remove(&path);
        }
    }

    /// Inodes that `prefix` or a path below it names now (not those unlinked or retired,
    /// which live on only for what holds them).
    pub fn under(&self, prefix: &Path) -> Vec<(u64, PathBuf)> {
        let inner = self.inner.read();
        inner
            .by_ino
            .iter()
            .filter(|(ino, e)| {
                e.path.starts_with(prefix) && inner.by_path.get(&e.path) == Some(*ino)
            })
            .map(|(&ino, e)| (ino, e.path.clone()))
            .collect()
    }

    /// The kernel dropped `n` lookups of `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let mut inner = self.inner.write();
        let Some(e) = inner.by_ino.get_mut(&ino) else {
            return;
        };
        e.lookups = e.lookups.saturating_sub(n);
        if e.lookups == 0 && e.handles == 0 {
            let e = inner.by_ino.remove(&ino).expect("present");
            if inner.by_path.get(&e.path) == Some(&ino) {
                inner.by_path.remove(&e.path);
            }
        }
    }

    /// A handle was opened on `ino`: it lives, and keeps its number, until
    /// [`InodeTable::let_go`], even if the kernel forgets it first.
    pub fn hold(&self, ino: u64) {
        let mut inner = self.inner.write();
        let e = inner.by_ino.get_mut(&ino);
        // A handle is opened only on an inode the kernel holds (looked up, or made).
        debug_assert!(e.is_some(), "a handle of unknown inode {ino}");
        if let Some(e) = e {
            e.handles += 1;
        }
    }

    /// A handle of `ino` was released: an inode the kernel forgot goes with its last one
    /// (then `true`).
    pub fn let_go(&self, ino: u64) -> bool {
        let mut inner = self.inner.write();
        let Some(e) = inner.by_ino.get_mut(&ino) else {
            return false;
        };
        e.handles = e.handles.saturating_sub(1);
        if e.lookups == 0 && e.handles == 0 {
            let e = inner.by_ino.remove(&ino).expect("present");
            if inner.by_path.get(&e.path) == Some(&ino) {
                inner.by_path.remove(&e.path);
            }
            return true;
        }
        false
    }

    /// Number of live inodes (for stats and tests).
    pub fn len(&self) -> usize {
        self.inner.read().by_ino.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(rel: &str) -> Node {
        Node::Dir { rel: rel.into() }
    }

    #[test]
    fn lookups_and_forgets_balance() {
        let t = InodeTable::new(dir(""));
        let a = t.intern("a".into(), dir("a"));
        assert_eq!(t.intern("a".into(), dir("a")), a);
        assert_eq!(t.len(), 2);
        t.forget(a, 1);
        assert!(t.get(a).is_some());
        t.forget(a, 1);
        assert!(t.get(a).is_none());
        assert_eq!(t.peek(Path::new("a")), None);
        let b = t.intern("a".into(), dir("a"));
        assert_eq!(a, b, "a path looked up again gets the number it had");
        assert_eq!(a, stable_ino(Path::new("a"), Kind::Dir));
        t.forget(ROOT_INO, 100);
        assert!(t.get(ROOT_INO).is_some());
    }

    #[test]
    fn a_path_keeps_a_counted_number_after_it_is_forgotten() {
        // A directory removed while the kernel still holds it, and made again: its hash
        // is taken, so it gets a counted number, which stays when the old inode goes and
        // the new one is forgotten and looked up again (issue 33, finding 4).
        let t = InodeTable::new(dir(""));
        let old = t.intern("d".into(), dir("d"));
        t.detach(Path::new("d"));
        let new = t.intern("d".into(), dir("d"));
        assert_ne!(old, new);
        assert_eq!(t.number(Path::new("d"), Kind::Dir), new);
        t.forget(old, 1);
        t.forget(new, 1);
        assert_eq!(t.number(Path::new("d"), Kind::Dir), new, "d_ino");
        assert_eq!(t.intern("d".into(), dir("d")), new, "st_ino");
    }

    #[test]
    fn a_changed_kind_gets_a_new_inode() {
        let t = InodeTable::new(dir(""));
        let a = t.intern("a".into(), dir("a"));
        let f = t.intern("a".into(), Node::File { rel: "a".into() });
        assert_ne!(a, f);
        // The old inode stays valid until forgotten, but no longer owns the path.
        assert!(t.get(a).is_some());
        t.forget(a, 1);
        assert_eq!(t.peek(Path::new("a")), Some(f));
    }

    #[test]
    fn a_taken_number_is_not_given_twice() {
        let t = InodeTable::new(dir(""));
        let f = Node::File { rel: "a".into() };
        let a = t.intern("a".into(), f.clone());
        // Unlinked while open: the inode lives on; a new file at that path is another.
        t.detach(Path::new("a"));
        let b = t.intern("a".into(), f.clone());
        assert_ne!(a, b);
        assert!(b < 1 << 63, "from the counter");
        // Renamed: the moved inode keeps its number; the old path gets another.
        t.rename(Path::new("a"), "c".into(), f.clone());
        assert_eq!(t.peek(Path::new("c")), Some(b));
        let d = t.intern("d".into(), f.clone());
        t.rename(Path::new("d"), "e".into(), f.clone());
        let d2 = t.intern("d".into(), f);
        assert_ne!(d, d2);
        assert_eq!(t.peek(Path::new("e")), Some(d));
    }

    #[test]
    fn a_listed_number_taken_by_another_inode_is_the_one_its_lookup_gives() {
        let t = InodeTable::new(dir(""));
        let f = Node::File { rel: "a".into() };
        let a = t.intern("a".into(), f.clone());
        // "b" would hash to a's number (forced: a's number is free no more for "a" moved).
        t.rename(Path::new("a"), "b".into(), f.clone());
        let listed = t.number(Path::new("a"), f.kind());
        assert_ne!(listed, a, "a's old number is b's now");
        assert_eq!(t.number(Path::new("a"), f.kind()), listed);
        assert_eq!(t.intern("a".into(), f), listed);
    }

    #[test]
    fn the_numbered_names_of_a_directory_number_in_key_order() {
        let f = Kind::File;
        let ino = |p: &str| stable_ino(Path::new(p), f);
        let row: Vec<u64> = (0..12).map(|j| ino(&format!("a/c/3/{j}"))).collect();
        assert!(row.windows(2).all(|w| w[0] + 1 == w[1]), "{row:x?}");
        // Another directory, kind or a name that is no plain number: numbers apart.
        assert_ne!(ino("a/c/4/0") & !0xfffff, ino("a/c/3/0") & !0xfffff);
        assert_ne!(stable_ino(Path::new("a/c/3/0"), Kind::Dir), ino("a/c/3/0"));
        assert_ne!(ino("a/c/3/00"), ino("a/c/3/0"));
        assert_ne!(ino("a/c/3/+5"), ino("a/c/3/5"));
        assert!(ino("a/c/3/x") >= 1 << 63 && ino("a/c/3/0") >= 1 << 63);
    }
}
