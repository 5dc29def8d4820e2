//! Inode numbers for the virtual tree: a path ↔ inode table with kernel lookup counts.
//!
//! An inode lives from the first `lookup` that returns it until the kernel `forget`s it
//! as often as it looked it up. The same path keeps its inode while it is known, so hard
//! link detection (`cp -a`, `tar`) sees stable numbers.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use parking_lot::RwLock;

use super::node::Node;

pub const ROOT_INO: u64 = 1;

struct Entry {
    path: PathBuf,
    node: Node,
    lookups: u64,
}

struct Inner {
    by_path: HashMap<PathBuf, u64>,
    by_ino: HashMap<u64, Entry>,
    next: u64,
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
            },
        );
        let mut by_path = HashMap::new();
        by_path.insert(PathBuf::new(), ROOT_INO);
        InodeTable {
            inner: RwLock::new(Inner {
                by_path,
                by_ino,
                next: ROOT_INO + 1,
            }),
        }
    }

    /// The virtual path and node of `ino`.
    pub fn get(&self, ino: u64) -> Option<(PathBuf, Node)> {
        self.inner
            .read()
            .by_ino
            .get(&ino)
            .map(|e| (e.path.clone(), e.node.clone()))
    }

    /// The inode already given to `path`, if any (for `readdir`'s `d_ino`).
    pub fn peek(&self, path: &Path) -> Option<u64> {
        self.inner.read().by_path.get(path).copied()
    }

    /// Give `path` an inode for `node` and count one kernel lookup. A path whose node
    /// changed kind (a file became a directory) gets a fresh inode.
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
        let ino = inner.next;
        inner.next += 1;
        inner.by_path.insert(path.clone(), ino);
        inner.by_ino.insert(
            ino,
            Entry {
                path,
                node,
                lookups: 1,
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

    /// Inodes whose path is `prefix` or below it.
    pub fn under(&self, prefix: &Path) -> Vec<(u64, PathBuf)> {
        self.inner
            .read()
            .by_ino
            .iter()
            .filter(|(_, e)| e.path.starts_with(prefix))
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
        if e.lookups == 0 {
            let e = inner.by_ino.remove(&ino).expect("present");
            if inner.by_path.get(&e.path) == Some(&ino) {
                inner.by_path.remove(&e.path);
            }
        }
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
        assert_ne!(a, b, "inode numbers are not reused");
        t.forget(ROOT_INO, 100);
        assert!(t.get(ROOT_INO).is_some());
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
}
