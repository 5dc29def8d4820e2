//! Metadata shown as its writer wrote it: a document written through the mount (a new
//! array's `zarr.json`, a rewrite of one, v2 `.zarray`/`.zattrs`/`.zgroup`) is shown
//! byte for byte in place of the view's own rendering of the stored document, while the
//! two are the same JSON value. A writer reads back what it wrote, as from a plain
//! directory (`cmp`, `rsync -c`), and what the kernel keeps of its write (the length, the
//! pages) is what the mount serves, however late the invalidation after the write reaches
//! the kernel: before, a read right after a write could get the rendering cut at the
//! writer's length. Once the stored document is another (another mount's write, a change
//! this mount made that the writer's document does not describe), the rendering is shown
//! again, as on later mounts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use super::Overlay;
use super::TreeRead;
use super::{MetaFile, write_api};

/// At most this many documents, of at most this many bytes in all (none over an eighth
/// of it), are kept; the oldest goes first.
const MAX_DOCS: usize = 4096;
const MAX_BYTES: usize = 32 << 20;

/// One metadata file the view shows: where the array's (or group's) metadata is stored,
/// and which of its view files.
pub(super) type MetaKey = (PathBuf, MetaFile);

/// A document kept: when (the order of keeping), and its bytes.
type Kept = (u64, Arc<Vec<u8>>);

/// The documents kept, by file ([`super::Writer::as_written`], a leaf lock).
#[derive(Default)]
pub(super) struct AsWritten {
    docs: HashMap<MetaKey, Kept>,
    /// Order of keeping: the oldest (smallest) goes first.
    next: u64,
    /// Bytes kept in all.
    held: usize,
}

/// A document kept by [`Overlay::remember_as_written`], with the one it replaced: put back
/// by [`Overlay::forget_as_written`] if the write is refused.
pub(super) struct Remembered {
    key: MetaKey,
    bytes: Arc<Vec<u8>>,
    previous: Option<Kept>,
}

impl AsWritten {
    /// The document kept for `file` at `meta_rel`.
    pub(super) fn doc(&self, meta_rel: &Path, file: MetaFile) -> Option<Arc<Vec<u8>>> {
        if self.docs.is_empty() {
            return None;
        }
        self.docs
            .get(&(meta_rel.to_path_buf(), file))
            .map(|(_, b)| b.clone())
    }

    fn take(&mut self, key: &MetaKey) -> Option<Kept> {
        let old = self.docs.remove(key)?;
        self.held -= old.1.len();
        Some(old)
    }

    fn put(&mut self, key: MetaKey, doc: Kept) {
        self.held += doc.1.len();
        if let Some(old) = self.docs.insert(key, doc) {
            self.held -= old.1.len();
        }
    }

    /// Keep `bytes` for `key`: what it replaced, and the keys let go to make room.
    fn keep(&mut self, key: MetaKey, bytes: &Arc<Vec<u8>>) -> (Option<Kept>, Vec<MetaKey>) {
        let previous = self.take(&key);
        let mut evicted = Vec::new();
        if bytes.len() > MAX_BYTES / 8 {
            return (previous, evicted); // shown as the view renders it
        }
        while self.docs.len() >= MAX_DOCS || self.held + bytes.len() > MAX_BYTES {
            let Some(oldest) = self
                .docs
                .iter()
                .min_by_key(|(_, (seq, _))| *seq)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            self.take(&oldest);
            evicted.push(oldest);
        }
        self.next += 1;
        self.put(key, (self.next, bytes.clone()));
        (previous, evicted)
    }

    /// A directory of the store moved from `from` to `to` (replacing what was there):
    /// its documents with it.
    pub(super) fn rebase(&mut self, from: &Path, to: &Path) {
        let replaced: Vec<MetaKey> = self
            .docs
            .keys()
            .filter(|(p, _)| p.starts_with(to))
            .cloned()
            .collect();
        for key in replaced {
            self.take(&key);
        }
        let moved: Vec<MetaKey> = self
            .docs
            .keys()
            .filter(|(p, _)| p.starts_with(from))
            .cloned()
            .collect();
        for key in moved {
            let doc = self.take(&key).expect("listed above");
            let rel = key.0.strip_prefix(from).expect("filtered above");
            self.put((to.join(rel), key.1), doc);
        }
    }
}

impl Overlay<'_> {
    /// A writer's document `file` of the array whose metadata is stored at `key.0`,
    /// about to be taken in: kept to be shown as written ([`TreeRead::as_written`]).
    pub(super) fn remember_as_written(&self, key: MetaKey, bytes: &[u8]) -> Remembered {
        let w = self.w;
        let bytes = Arc::new(bytes.to_vec());
        let (previous, evicted) = w.as_written.lock().keep(key.clone(), &bytes);
        // Shown as the view renders them from now on: what the kernel keeps of them
        // (a writer's length) goes.
        for (meta_rel, file) in evicted {
            let shown = meta_rel.with_file_name(file.name());
            if let Some(ino) = self.tree.inodes.peek(&shown) {
                w.invalidate(write_api::Invalidation::Inode(ino));
            }
        }
        Remembered {
            key,
            bytes,
            previous,
        }
    }
}

impl Overlay<'_> {
    /// The document kept by [`Overlay::remember_as_written`] was refused: the one it
    /// replaced is put back (still shown while the stored document is the one it made),
    /// unless another write of the same file came since.
    pub(super) fn forget_as_written(&self, r: Remembered) {
        let (w, bytes) = (self.w, r.bytes);
        let mut kept = w.as_written.lock();
        let ours = match kept.docs.get(&r.key) {
            Some((_, b)) => Arc::ptr_eq(b, &bytes),
            // Not kept (too large) or let go since.
            None => true,
        };
        if ours {
            kept.take(&r.key);
            if let Some(previous) = r.previous {
                kept.put(r.key, previous);
            }
        }
    }
}

impl TreeRead<'_> {
    /// `rendered`, the view's document `file` of the array (or group) whose metadata is
    /// stored at `meta_rel`, or the same document as a writer of this mount wrote it.
    pub(super) fn as_written(
        &self,
        meta_rel: &Path,
        file: MetaFile,
        rendered: Arc<Vec<u8>>,
    ) -> Arc<Vec<u8>> {
        let Some(w) = &self.overlay else {
            return rendered;
        };
        match w.as_written(meta_rel, file) {
            Some(bytes) if same_json(&bytes, &rendered) => bytes,
            _ => rendered,
        }
    }
}

/// Whether `a` and `b` are the same JSON value (formatting and key order aside).
fn same_json(a: &[u8], b: &[u8]) -> bool {
    a == b
        || matches!(
            (serde_json::from_slice::<Value>(a), serde_json::from_slice::<Value>(b)),
            (Ok(a), Ok(b)) if a == b
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(p: &str) -> MetaKey {
        (PathBuf::from(p), MetaFile::ZarrJson)
    }

    #[test]
    fn the_oldest_goes_first_and_the_bytes_stay_bounded() {
        let mut kept = AsWritten::default();
        let doc = Arc::new(vec![b' '; MAX_BYTES / 8]);
        for i in 0..8 {
            let (_, evicted) = kept.keep(key(&format!("a{i}/zarr.json")), &doc);
            assert!(evicted.is_empty(), "{i}: room for 8");
        }
        // Kept again: now the newest.
        kept.keep(key("a0/zarr.json"), &doc);
        let (_, evicted) = kept.keep(key("b/zarr.json"), &Arc::new(vec![b' '; 10]));
        assert_eq!(evicted, [key("a1/zarr.json")], "the oldest");
        assert_eq!(kept.held, 7 * (MAX_BYTES / 8) + 10);
        let too_large = Arc::new(vec![b' '; MAX_BYTES / 8 + 1]);
        let (previous, evicted) = kept.keep(key("b/zarr.json"), &too_large);
        assert!(previous.is_some() && evicted.is_empty());
        assert!(!kept.docs.contains_key(&key("b/zarr.json")), "not kept");
        assert_eq!(kept.held, 7 * (MAX_BYTES / 8));
    }

    #[test]
    fn documents_move_with_their_directory() {
        let mut kept = AsWritten::default();
        let doc = Arc::new(b"{}".to_vec());
        kept.keep(key("g/a/zarr.json"), &doc);
        kept.keep(key("g/ab/zarr.json"), &doc);
        kept.rebase(Path::new("g/a"), Path::new("h/a"));
        let mut keys: Vec<_> = kept.docs.keys().map(|(p, _)| p.clone()).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                PathBuf::from("g/ab/zarr.json"),
                PathBuf::from("h/a/zarr.json")
            ]
        );
        assert_eq!(kept.held, 4);
    }

    #[test]
    fn the_same_value_is_the_same_document() {
        assert!(same_json(
            br#"{"a":1,"b":[2]}"#,
            b"{\n  \"b\": [2],\n  \"a\": 1\n}\n"
        ));
        assert!(!same_json(br#"{"a":1}"#, br#"{"a":1.0}"#));
        assert!(!same_json(
            br#"{"a":1"#,
            br#"{"a":1"#.as_slice().get(..5).unwrap()
        ));
    }
}
