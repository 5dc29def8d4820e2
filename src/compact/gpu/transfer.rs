//! The copy schedule of one GPU compaction: the metadata's H2D and the offsets' D2H
//! (both transfers), and for copy transfers staging + H2D of the data before the
//! kernels and D2H + copy-out after them, in `PIECE_BYTES` pieces so the host's memcpy
//! overlaps the DMA.

use super::layout::{Layout, SRC_PAD};
use super::{GpuState, PIECE_BYTES, at, new_event};
use crate::compact::{CompactError, Packed, StagedBatch};

/// Writes `values` into `dst` as native-endian words (the device shares the host's
/// little-endian layout).
fn put_u64s(dst: &mut [u8], values: &[u64]) {
    for (word, v) in dst.chunks_exact_mut(8).zip(values) {
        word.copy_from_slice(&v.to_ne_bytes());
    }
}

fn put_u32s(dst: &mut [u8], values: &[u32]) {
    for (word, v) in dst.chunks_exact_mut(4).zip(values) {
        word.copy_from_slice(&v.to_ne_bytes());
    }
}

/// `out.offsets` from the native-endian words in `raw`.
fn read_offsets(raw: &[u8], out: &mut Packed) {
    out.offsets.clear();
    out.offsets.extend(
        raw.chunks_exact(8)
            .map(|w| u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]])),
    );
}

/// `start..end` ranges of at most `PIECE_BYTES` covering `0..len`.
fn pieces(len: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len)
        .step_by(PIECE_BYTES)
        .map(move |start| (start, (start + PIECE_BYTES).min(len)))
}

impl GpuState {
    /// Stages the metadata (`src_offsets`, `sizes`, `perm`) in pinned memory and
    /// queues its H2D copy.
    pub(super) fn upload_meta(
        &mut self,
        batch: &StagedBatch<'_>,
        layout: &Layout,
    ) -> Result<(), CompactError> {
        self.upload_with_data(batch, layout, false)
    }

    /// Stages metadata and `batch.data` in pinned memory and queues their H2D copies.
    pub(super) fn upload(
        &mut self,
        batch: &StagedBatch<'_>,
        layout: &Layout,
    ) -> Result<(), CompactError> {
        self.upload_with_data(batch, layout, true)
    }

    fn upload_with_data(
        &mut self,
        batch: &StagedBatch<'_>,
        layout: &Layout,
        with_data: bool,
    ) -> Result<(), CompactError> {
        let stream = &self.stream;
        let data_len = if with_data { layout.data_len } else { 0 };
        let staging = self
            .staging
            .ensure(&self.ctx, layout.meta_len + data_len)
            .map_err(at("pinned alloc"))?;
        let (meta, data) = staging.split_at_mut(layout.meta_len);
        put_u64s(&mut meta[..layout.sizes_at], batch.src_offsets);
        put_u64s(&mut meta[layout.sizes_at..layout.perm_at], batch.sizes);
        put_u32s(&mut meta[layout.perm_at..], &self.perm);
        let d_meta = self
            .d_meta
            .ensure(stream, layout.meta_len)
            .map_err(at("device alloc"))?;
        stream
            .memcpy_htod(&*meta, &mut d_meta.slice_mut(..layout.meta_len))
            .map_err(at("H2D metadata"))?;
        if !with_data {
            return Ok(());
        }

        let d_src = self
            .d_src
            .ensure(stream, layout.src_len())
            .map_err(at("device alloc"))?;
        for (start, end) in pieces(layout.data_len) {
            data[start..end].copy_from_slice(&batch.data[start..end]);
            stream
                .memcpy_htod(
                    &data[start..end],
                    &mut d_src.slice_mut(SRC_PAD + start..SRC_PAD + end),
                )
                .map_err(at("H2D data"))?;
        }
        Ok(())
    }

    /// Queues the D2H copy of the offsets into the pinned result buffer (grown to
    /// `result_len` bytes) and records event 0 after it, with at least `events` events.
    fn queue_offsets(
        &mut self,
        layout: &Layout,
        result_len: usize,
        events: usize,
    ) -> Result<(), CompactError> {
        let stream = &self.stream;
        let offsets_len = (layout.n + 1) * 8;
        let result = self
            .result
            .ensure(&self.ctx, result_len)
            .map_err(at("pinned alloc"))?;
        while self.events.len() < events {
            self.events
                .push(new_event(&self.ctx).map_err(at("event create"))?);
        }
        let d_scan = self
            .d_scan
            .ensure(stream, layout.offsets_at + offsets_len)
            .map_err(at("device alloc"))?;
        stream
            .memcpy_dtoh(
                &d_scan.slice(layout.offsets_at..layout.offsets_at + offsets_len),
                &mut result[..offsets_len],
            )
            .map_err(at("D2H offsets"))?;
        self.events[0].record(stream).map_err(at("event record"))
    }

    /// Queues the D2H copy of the offsets and waits (sleeping) until it, and so
    /// everything queued before it, is done; `out.offsets` gets them.
    pub(super) fn download_offsets(
        &mut self,
        layout: &Layout,
        out: &mut Packed,
    ) -> Result<(), CompactError> {
        let offsets_len = (layout.n + 1) * 8;
        self.queue_offsets(layout, offsets_len, 1)?;
        self.events[0].synchronize().map_err(at("gather"))?;
        let result = self
            .result
            .ensure(&self.ctx, offsets_len)
            .map_err(at("pinned alloc"))?;
        read_offsets(&result[..offsets_len], out);
        Ok(())
    }

    /// Queues the D2H copies of offsets and packed bytes, then copies each piece out of
    /// pinned memory into `out` as soon as it has arrived. Returns with the stream idle.
    pub(super) fn download(
        &mut self,
        layout: &Layout,
        out: &mut Packed,
    ) -> Result<(), CompactError> {
        let offsets_len = (layout.n + 1) * 8;
        let result_len = layout.result_data_at + layout.total;
        let pieces_needed = layout.total.div_ceil(PIECE_BYTES) + 1;
        self.queue_offsets(layout, result_len, pieces_needed)?;
        let stream = &self.stream;
        let result = self
            .result
            .ensure(&self.ctx, result_len)
            .map_err(at("pinned alloc"))?;
        let d_dst = self
            .d_dst
            .ensure(stream, layout.total)
            .map_err(at("device alloc"))?;
        let data_at = layout.result_data_at;
        for (k, (start, end)) in pieces(layout.total).enumerate() {
            stream
                .memcpy_dtoh(
                    &d_dst.slice(start..end),
                    &mut result[data_at + start..data_at + end],
                )
                .map_err(at("D2H data"))?;
            self.events[k + 1]
                .record(stream)
                .map_err(at("event record"))?;
        }

        self.events[0].synchronize().map_err(at("D2H offsets"))?;
        read_offsets(&result[..offsets_len], out);
        out.data.clear();
        out.data.reserve(layout.total);
        for (k, (start, end)) in pieces(layout.total).enumerate() {
            self.events[k + 1].synchronize().map_err(at("D2H data"))?;
            out.data
                .extend_from_slice(&result[data_at + start..data_at + end]);
        }
        Ok(())
    }
}
