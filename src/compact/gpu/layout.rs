//! The byte layout of one GPU compaction's buffers (metadata, scan, source and result),
//! computed once per call from the batch's sizes. Not the buffers themselves
//! (`gpu_buffers`) nor what is copied into them (`transfer`).

/// `data` sits this many bytes into the device source buffer, which has as many spare
/// bytes after it: the gather's aligned loads reach up to 3 bytes before a chunk and
/// 4 after it.
pub(super) const SRC_PAD: usize = 16;

/// Byte layout of one call's buffers, computed once.
pub(super) struct Layout {
    pub(super) n: usize,
    pub(super) data_len: usize,
    pub(super) total: usize,
    /// In `d_meta` and staging: src_offsets at 0, sizes at `sizes_at`, perm at `perm_at`.
    pub(super) sizes_at: usize,
    pub(super) perm_at: usize,
    /// Metadata bytes, rounded up to 16; the data follows in staging.
    pub(super) meta_len: usize,
    /// In `d_scan`: psizes at 0, offsets (n + 1) at `offsets_at`.
    pub(super) offsets_at: usize,
    /// In the result buffer: offsets at 0, packed data at `result_data_at`.
    pub(super) result_data_at: usize,
}

impl Layout {
    /// Bytes of the device source buffer: `data` with `SRC_PAD` on both sides.
    pub(super) fn src_len(&self) -> usize {
        self.data_len + 2 * SRC_PAD
    }

    pub(super) fn new(n: usize, data_len: usize, total: u64) -> Self {
        let sizes_at = n * 8;
        let perm_at = 2 * n * 8;
        let meta_len = (perm_at + n * 4).next_multiple_of(16);
        let offsets_len = (n + 1) * 8;
        Self {
            n,
            data_len,
            total: total as usize, // `plan` checked total <= isize::MAX
            sizes_at,
            perm_at,
            meta_len,
            offsets_at: n * 8,
            result_data_at: offsets_len.next_multiple_of(16),
        }
    }
}
