//! Loading the seed's blosc containers from any store, and reading their chunks checked:
//! the view keeps what is loaded here (`super`), `shardfs info` lists it ([`inspect`]).
//! The byte layouts are parsed in `format` (`bcolz`, `bloscpack`, `blosc`).

use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::Arc;

use super::{
    BLOSCPACK_SUFFIXES, ContainerArray, ContainerGroup, ContainerNode, LastChunk, Source,
    read_only_dir,
};
use crate::format::bcolz::{self, CarrayMeta};
use crate::format::blosc;
use crate::format::bloscpack::{self, BloscpackError};
use crate::store::{EntryKind, EntryMeta, Store};

pub(super) fn small_file(
    store: &dyn Store,
    rel: &Path,
) -> std::result::Result<Option<Vec<u8>>, String> {
    let show = |e: io::Error| format!("{}: {e}", rel.display());
    let Some(file) = store.open(rel).map_err(show)? else {
        return Ok(None);
    };
    let len = file.meta().map_err(show)?.len;
    if len > bcolz::MAX_JSON {
        return Err(format!("{}: {len} bytes", rel.display()));
    }
    let mut b = vec![0; len as usize];
    file.read_exact_at(&mut b, 0).map_err(show)?;
    Ok(Some(b))
}

pub(super) fn load_carray_array(
    store: &dyn Store,
    rel: &Path,
    m: &EntryMeta,
) -> std::result::Result<Arc<ContainerArray>, String> {
    let need = |f: &str| -> std::result::Result<Vec<u8>, String> {
        small_file(store, &rel.join(f))?.ok_or_else(|| format!("no {f}"))
    };
    let meta = CarrayMeta::parse(&need(bcolz::SIZES)?, &need(bcolz::STORAGE)?)?;
    let attrs = bcolz::attributes(small_file(store, &rel.join(bcolz::ATTRS))?.as_deref());
    let first = if meta.nchunks() > 0 {
        let path = rel.join(bcolz::chunk_file(0));
        let file = store
            .open(&path)
            .map_err(|e| e.to_string())?
            .ok_or("no chunk file data/__0.blp")?;
        let mut h = [0u8; bcolz::CHUNK_HEADER_LEN + blosc::HEADER_LEN];
        file.read_exact_at(&mut h, 0)
            .map_err(|e| format!("data/__0.blp: {e}"))?;
        Some(
            blosc::FrameHeader::parse(&h[bcolz::CHUNK_HEADER_LEN..])
                .map_err(|e| format!("data/__0.blp: {e}"))?,
        )
    } else {
        None
    };
    let mut array = ContainerArray::new(
        rel.to_path_buf(),
        "bcolz carray",
        meta.shown(first.as_ref(), attrs),
        Source::Bcolz,
        read_only_dir(*m),
    );
    array.last = last_chunk(store, &array);
    Ok(Arc::new(array))
}

pub(super) fn load_carray(
    store: &dyn Store,
    rel: &Path,
    m: &EntryMeta,
) -> std::result::Result<ContainerNode, String> {
    Ok(ContainerNode::Array(load_carray_array(store, rel, m)?))
}

pub(super) fn load_ctable(
    store: &dyn Store,
    rel: &Path,
    m: &EntryMeta,
) -> std::result::Result<ContainerNode, String> {
    let names = small_file(store, &rel.join(bcolz::ROOTDIRS))?.ok_or("no __rootdirs__")?;
    let columns = bcolz::columns(&names)?;
    let attributes = bcolz::attributes(small_file(store, &rel.join(bcolz::ATTRS))?.as_deref());
    Ok(ContainerNode::Group(Arc::new(ContainerGroup {
        rel: rel.to_path_buf(),
        columns,
        meta: read_only_dir(*m),
        attributes,
    })))
}

pub(super) fn load_bloscpack(
    store: &dyn Store,
    rel: &Path,
    file: &dyn crate::store::StoreFile,
    m: &EntryMeta,
) -> std::result::Result<ContainerNode, String> {
    let len = m.len;
    let mut want = len.min(4096);
    let prefix = loop {
        let mut b = vec![0; want as usize];
        file.read_exact_at(&mut b, 0).map_err(|e| e.to_string())?;
        match bloscpack::parse_prefix(&b, len) {
            Err(BloscpackError::NeedMore(n)) if n > want && n <= len => want = n,
            Err(e) => return Err(format!("bloscpack file: {e}")),
            Ok(p) => break p,
        }
    };
    let chunks = bloscpack::chunk_table(&prefix, len, |off| {
        let mut h = [0u8; blosc::HEADER_LEN];
        file.read_exact_at(&mut h, off)?;
        Ok(h)
    })
    .map_err(|e| format!("bloscpack file: {e}"))?;
    let array =
        bloscpack::shown_array(&prefix, &chunks).map_err(|e| format!("bloscpack file: {e}"))?;
    let mut array = ContainerArray::new(
        rel.to_path_buf(),
        "bloscpack file",
        array,
        Source::Bloscpack {
            chunks,
            checksum: prefix.header.checksum,
        },
        read_only_dir(*m),
    );
    array.last = last_chunk(store, &array);
    Ok(ContainerNode::Array(Arc::new(array)))
}

/// The short last chunk decoded, padded with the fill value to a whole chunk and
/// encoded again as an uncompressed frame, by c-blosc.
pub(super) fn last_chunk(store: &dyn Store, a: &ContainerArray) -> LastChunk {
    let n = a.array.nchunks();
    if n == 0 || !a.is_short(n - 1) {
        return None;
    }
    Some((|| {
        let frame = stored_frame(store, a, n - 1)?;
        let h = blosc::FrameHeader::parse(&frame).map_err(|e| e.to_string())?;
        let data = blosc::decode(&frame, h.nbytes as usize).map_err(|e| e.to_string())?;
        let whole = a.array.chunk_bytes() as usize;
        if data.len() > whole || data.len() % a.array.dtype.size as usize != 0 {
            return Err(format!(
                "the last chunk holds {} bytes, a chunk {whole}",
                data.len()
            ));
        }
        let mut padded = data;
        let fill = a.array.fill_element();
        while padded.len() < whole {
            padded.extend_from_slice(&fill);
        }
        padded.truncate(whole);
        blosc::encode_uncompressed(&padded, a.array.codec.typesize as usize, 0)
            .map(Arc::new)
            .map_err(|e| e.to_string())
    })())
}

/// The frame of chunk `i` as the container stores it, checked (bcolz: the chunk
/// file's header and frame size; bloscpack: the checksum after it).
pub(super) fn stored_frame(
    store: &dyn Store,
    a: &ContainerArray,
    i: u64,
) -> std::result::Result<Vec<u8>, String> {
    match &a.source {
        Source::Bcolz => {
            let rel = a.rel.join(bcolz::chunk_file(i));
            let file = store
                .open(&rel)
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("no {}", bcolz::chunk_file(i)))?;
            let len = file.meta().map_err(|e| e.to_string())?.len;
            if len > blosc::MAX_BUFFER + 64 {
                return Err(format!("{}: {len} bytes", bcolz::chunk_file(i)));
            }
            let mut b = vec![0; len as usize];
            file.read_exact_at(&mut b, 0).map_err(|e| e.to_string())?;
            let (_, h) =
                bcolz::chunk_frame(&b).map_err(|e| format!("{}: {e}", bcolz::chunk_file(i)))?;
            if !a.is_short(i) && u64::from(h.nbytes) != a.array.chunk_bytes() {
                return Err(format!(
                    "{}: its frame holds {} bytes, a chunk {}",
                    bcolz::chunk_file(i),
                    h.nbytes,
                    a.array.chunk_bytes()
                ));
            }
            b.drain(..bcolz::CHUNK_HEADER_LEN);
            Ok(b)
        }
        Source::Bloscpack { chunks, checksum } => {
            let c = chunks.get(i as usize).ok_or("no such chunk")?;
            let file = store
                .open(&a.rel)
                .map_err(|e| e.to_string())?
                .ok_or("the file is gone")?;
            let mut b = vec![0; (c.frame_len() + checksum.digest_len()) as usize];
            file.read_exact_at(&mut b, c.offset)
                .map_err(|e| format!("chunk {i}: {e}"))?;
            let digest = b.split_off(c.frame_len() as usize);
            if !bloscpack::verify(*checksum, &b, &digest) {
                return Err(format!("chunk {i}: {} checksum mismatch", checksum.name()));
            }
            if blosc::FrameHeader::parse(&b).ok() != Some(c.frame) {
                return Err(format!("chunk {i}: its frame changed"));
            }
            Ok(b)
        }
    }
}

pub(super) fn bloscpack_named(rel: &Path) -> bool {
    rel.file_name()
        .and_then(OsStr::to_str)
        .is_some_and(|n| BLOSCPACK_SUFFIXES.iter().any(|s| n.ends_with(s)))
}

/// What store entry `rel` (with metadata `m`) is as a container, for `shardfs info`:
/// `None` where it is none, `Some(Err(why))` where it is one that cannot be shown.
pub fn inspect(
    store: &dyn Store,
    rel: &Path,
    m: &EntryMeta,
) -> io::Result<Option<std::result::Result<ContainerNode, String>>> {
    let is_file = |f: &str| -> io::Result<bool> {
        Ok(store
            .stat(&rel.join(f))?
            .is_some_and(|m| m.kind == EntryKind::File))
    };
    match m.kind {
        EntryKind::Dir if is_file(bcolz::ROOTDIRS)? => Ok(Some(load_ctable(store, rel, m))),
        EntryKind::Dir if is_file(bcolz::SIZES)? && is_file(bcolz::STORAGE)? => {
            Ok(Some(load_carray(store, rel, m)))
        }
        EntryKind::File if bloscpack_named(rel) && m.len >= 4 => {
            let Some(file) = store.open(rel)? else {
                return Ok(None);
            };
            let mut magic = [0u8; 4];
            file.read_exact_at(&mut magic, 0)?;
            if &magic != bloscpack::MAGIC {
                return Ok(None);
            }
            Ok(Some(load_bloscpack(store, rel, file.as_ref(), m)))
        }
        _ => Ok(None),
    }
}
