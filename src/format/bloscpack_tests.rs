//! Unit tests of the bloscpack parser: files built here as bloscpack 0.16 lays them out
//! (tests/containers.rs reads files bloscpack itself wrote), and one broken file per
//! check.

use super::*;

/// A bloscpack file of `data` cut into chunks of `chunk` bytes.
pub(crate) struct Built {
    pub file: Vec<u8>,
}

pub(crate) fn build(
    data: &[u8],
    chunk: usize,
    offsets: bool,
    meta: Option<&Value>,
    checksum: Checksum,
) -> Built {
    let chunks: Vec<&[u8]> = data.chunks(chunk).collect();
    let n = chunks.len();
    let mut f = Vec::new();
    f.extend_from_slice(MAGIC);
    f.push(VERSION);
    f.push(u8::from(offsets) | (u8::from(meta.is_some()) << 1));
    f.push(checksum as u8);
    f.push(8);
    f.extend_from_slice(&(chunk as i32).to_le_bytes());
    f.extend_from_slice(&(chunks.last().map_or(0, |c| c.len()) as i32).to_le_bytes());
    f.extend_from_slice(&(n as i64).to_le_bytes());
    f.extend_from_slice(&2i64.to_le_bytes());
    if let Some(m) = meta {
        let json = serde_json::to_vec(m).unwrap();
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut e, &json).unwrap();
        let z = e.finish().unwrap();
        let max = 10 * z.len();
        f.extend_from_slice(b"JSON\0\0\0\0");
        f.extend_from_slice(&[0, 1, 1, 6]);
        for v in [json.len(), max, z.len()] {
            f.extend_from_slice(&(v as u32).to_le_bytes());
        }
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&z);
        f.resize(f.len() + max - z.len(), 0);
        f.extend_from_slice(&Checksum::Adler32.digest(&z));
    }
    let table = f.len();
    if offsets {
        f.resize(f.len() + 8 * (n + 2), 0xff);
    }
    for (i, c) in chunks.iter().enumerate() {
        let off = f.len();
        if offsets {
            f[table + 8 * i..table + 8 * i + 8].copy_from_slice(&(off as i64).to_le_bytes());
        }
        let frame = blosc::encode_uncompressed(c, 8, 1).unwrap();
        f.extend_from_slice(&frame);
        f.extend_from_slice(&checksum.digest(&frame));
    }
    Built { file: f }
}

pub(crate) fn table(file: &[u8]) -> Result<(Prefix, Vec<ChunkEntry>), BloscpackError> {
    let p = parse_prefix(file, file.len() as u64)?;
    let chunks = chunk_table(&p, file.len() as u64, |off| {
        let mut h = [0; 16];
        let s = file
            .get(off as usize..off as usize + 16)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        h.copy_from_slice(s);
        Ok(h)
    })?;
    Ok((p, chunks))
}

fn floats(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| (i as f64).to_le_bytes()).collect()
}

#[test]
fn every_checksum_and_layout() {
    let data = floats(1000);
    let meta = serde_json::json!({"dtype": "'<f8'", "shape": [100, 10], "order": "C", "container": "numpy"});
    for code in 0..=8 {
        let ck = Checksum::from_code(code).unwrap();
        for offsets in [false, true] {
            for m in [None, Some(&meta)] {
                let b = build(&data, 2400, offsets, m, ck);
                let (p, chunks) = table(&b.file).unwrap();
                assert_eq!(chunks.len(), 4);
                for c in &chunks {
                    let end = (c.offset + c.frame_len()) as usize;
                    let frame = &b.file[c.offset as usize..end];
                    let digest = &b.file[end..end + ck.digest_len() as usize];
                    assert!(verify(ck, frame, digest));
                }
                let a = shown_array(&p, &chunks).unwrap();
                match m {
                    Some(_) => {
                        assert_eq!(
                            (a.shape.clone(), a.chunk_shape()),
                            (vec![100, 10], vec![30, 10])
                        );
                        assert_eq!(a.dtype.v3_name(), "float64");
                    }
                    None => assert_eq!((a.shape.clone(), a.chunk_len), (vec![8000], 2400)),
                }
            }
        }
    }
}

#[test]
fn chunks_off_whole_rows_are_shown_1d() {
    let meta = serde_json::json!({"dtype": "'<f8'", "shape": [100, 10], "order": "F", "container": "numpy"});
    let b = build(&floats(1000), 8 * 150, true, Some(&meta), Checksum::Crc32);
    let (p, chunks) = table(&b.file).unwrap();
    let a = shown_array(&p, &chunks).unwrap();
    assert_eq!((a.shape.clone(), a.chunk_len), (vec![1000], 150));
    let b = build(&floats(1000), 8 * 200, true, Some(&meta), Checksum::Crc32);
    let (p, chunks) = table(&b.file).unwrap();
    let a = shown_array(&p, &chunks).unwrap();
    assert_eq!((a.order, a.chunk_shape()), (Order::F, vec![100, 2]));
}

#[test]
fn broken_files_are_typed_errors() {
    let meta =
        serde_json::json!({"dtype": "'<f8'", "shape": [1000], "order": "C", "container": "numpy"});
    let good = build(&floats(1000), 2400, true, Some(&meta), Checksum::Sha1).file;
    // Truncated anywhere: never a panic, an error.
    for cut in [0, 3, 20, 40, 100, good.len() - 30, good.len() - 1] {
        assert!(table(&good[..cut]).is_err(), "cut at {cut}");
    }
    let mut bad = good.clone();
    bad[0] = b'x';
    assert_eq!(table(&bad).unwrap_err(), BloscpackError::Magic);
    let mut bad = good.clone();
    bad[4] = 2;
    assert_eq!(table(&bad).unwrap_err(), BloscpackError::Version(2));
    // An offset past the end.
    let p = parse_prefix(&good, good.len() as u64).unwrap();
    let table_at = p.data_start as usize - 8 * (4 + 2);
    let mut bad = good.clone();
    bad[table_at + 8..table_at + 16].copy_from_slice(&(1i64 << 40).to_le_bytes());
    assert!(matches!(
        table(&bad),
        Err(BloscpackError::Chunk { chunk: 1, .. })
    ));
    // A header whose chunk size disagrees with the frames.
    let mut bad = good.clone();
    bad[8..12].copy_from_slice(&2000i32.to_le_bytes());
    assert!(matches!(
        table(&bad),
        Err(BloscpackError::Chunk { chunk: 0, .. })
    ));
    let mut bad = good.clone();
    bad[12..16].copy_from_slice(&7i32.to_le_bytes());
    assert!(matches!(
        table(&bad),
        Err(BloscpackError::Chunk { chunk: 3, .. })
    ));
    // Malformed metadata JSON, and a metadata checksum that does not match.
    let mut bad = good.clone();
    bad[64] ^= 0xff;
    assert!(matches!(table(&bad), Err(BloscpackError::Metadata(_))));
    let no_json = build(&floats(10), 80, false, None, Checksum::None).file;
    let mut raw = no_json[..32].to_vec();
    raw[5] = 2;
    raw.extend_from_slice(b"JSON\0\0\0\0\0\0\0\0");
    raw.extend_from_slice(&[3, 0, 0, 0, 3, 0, 0, 0, 3, 0, 0, 0]);
    raw.extend_from_slice(&[0; 8]);
    raw.extend_from_slice(b"{{{");
    assert!(matches!(table(&raw), Err(BloscpackError::Metadata(_))));
    // Metadata that does not describe the data.
    let wrong = serde_json::json!({"dtype": "'<f8'", "shape": [999], "container": "numpy"});
    let b = build(&floats(1000), 2400, true, Some(&wrong), Checksum::None).file;
    let (p, chunks) = table(&b).unwrap();
    assert!(shown_array(&p, &chunks).is_err());
}

#[test]
fn a_file_without_offsets_is_walked() {
    let b = build(&floats(100), 160, false, None, Checksum::Md5).file;
    let (p, chunks) = table(&b).unwrap();
    assert_eq!(p.offsets, None);
    assert_eq!(chunks.len(), 5);
    assert_eq!(chunks[0].offset, HEADER_LEN as u64);
    // An unknown number of chunks: walked to the end of the file.
    let mut unknown = b.clone();
    unknown[16..24].copy_from_slice(&(-1i64).to_le_bytes());
    assert_eq!(table(&unknown).unwrap().1.len(), 5);
}
