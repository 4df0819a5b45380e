//! Writing an expert store: to a temporary in the destination's folder, renamed when complete.

use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use atomic_out::AtomicFile;

use super::{ExpertIndex, ExpertLayerIndex, ExpertLayout, ExpertShape, EXPERT_STORE};
use crate::error::{Result, StoreError};
use crate::layout::encode_header;
use crate::writer::write_error;

/// One layer's routed experts handed to [`ExpertStoreWriter::add_layer`]: the bytes of llama.cpp's
/// 3-D tensors, expert after expert (`n_experts × ff` gate rows, the same up rows, `n_experts ×
/// d_model` down rows of `ff` columns).
pub struct ExpertLayerInput<'a> {
    /// `ffn_gate_exps`'s bytes.
    pub gate: &'a [u8],
    /// `ffn_up_exps`'s bytes.
    pub up: &'a [u8],
    /// `ffn_down_exps`'s bytes.
    pub down: &'a [u8],
}

/// Writes an expert store layer by layer; nothing appears under the final name before
/// [`ExpertStoreWriter::finish`], and a dropped writer removes its temporary file.
pub struct ExpertStoreWriter {
    tmp: PathBuf,
    out: Option<BufWriter<AtomicFile>>,
    index: ExpertIndex,
    shapes: Vec<ExpertShape>,
    blob: Vec<u8>,
}

impl ExpertStoreWriter {
    /// Starts a store at `path` for a model `d_model` wide whose layers have `shapes`.
    pub fn create(path: impl AsRef<Path>, d_model: usize, shapes: &[ExpertShape]) -> Result<Self> {
        if shapes.is_empty() || d_model == 0 || d_model > u32::MAX as usize {
            return Err(StoreError::Invalid(format!(
                "expert store of {} layers, d_model {d_model}",
                shapes.len()
            )));
        }
        for (li, s) in shapes.iter().enumerate() {
            if s.n_experts > u32::MAX as usize || s.ff > u32::MAX as usize {
                return Err(StoreError::Invalid(format!("layer {li}: shape {s:?}")));
            }
            if s.n_experts > 0 {
                ExpertLayout::new(d_model, s)
                    .map_err(|e| StoreError::Invalid(format!("layer {li}: {e}")))?;
            }
        }
        let file = AtomicFile::create(path.as_ref()).map_err(write_error)?;
        let tmp = file.temp_path().to_path_buf();
        let data = ExpertIndex::data_offset(shapes);
        let mut w = ExpertStoreWriter {
            tmp,
            out: Some(BufWriter::with_capacity(1 << 20, file)),
            index: ExpertIndex {
                d_model,
                layers: Vec::new(),
                file_len: data,
            },
            shapes: shapes.to_vec(),
            blob: Vec::new(),
        };
        // Header and index are written last; zeros until then, so a partial file never validates.
        w.write_zeros(data as usize)?;
        Ok(w)
    }

    fn write_zeros(&mut self, n: usize) -> Result<()> {
        let zeros = vec![0u8; n.min(1 << 20)];
        let mut left = n;
        while left > 0 {
            let k = left.min(zeros.len());
            self.write_blob_part(&zeros[..k])?;
            left -= k;
        }
        Ok(())
    }

    fn write_blob_part(&mut self, bytes: &[u8]) -> Result<()> {
        let out = self
            .out
            .as_mut()
            .ok_or_else(|| StoreError::Invalid("writer already finished".into()))?;
        out.write_all(bytes).map_err(|source| StoreError::Write {
            path: self.tmp.clone(),
            source,
        })
    }

    /// Appends the next layer's experts, each one blob, checksummed.
    pub fn add_layer(&mut self, input: ExpertLayerInput<'_>) -> Result<()> {
        let li = self.index.layers.len();
        let shape = *self.shapes.get(li).ok_or_else(|| {
            StoreError::Invalid(format!(
                "layer {li} added to an expert store of {} layers",
                self.shapes.len()
            ))
        })?;
        let n = shape.n_experts;
        let layout = if n == 0 {
            ExpertLayout::EMPTY
        } else {
            ExpertLayout::new(self.index.d_model, &shape)?
        };
        for (name, m, each) in [
            ("gate", input.gate, layout.gate_bytes),
            ("up", input.up, layout.up_bytes),
            ("down", input.down, layout.down_bytes),
        ] {
            if m.len() != n * each {
                return Err(StoreError::Invalid(format!(
                    "layer {li}: {name} experts are {} bytes, expected {n} of {each}",
                    m.len()
                )));
            }
        }
        let mut offsets = Vec::with_capacity(n);
        let mut crc = Vec::with_capacity(n);
        for e in 0..n {
            let mut blob = std::mem::take(&mut self.blob);
            blob.clear();
            for (m, each) in [
                (input.gate, layout.gate_bytes),
                (input.up, layout.up_bytes),
                (input.down, layout.down_bytes),
            ] {
                blob.extend_from_slice(&m[e * each..(e + 1) * each]);
            }
            blob.resize(layout.blob_bytes, 0);
            crc.push(crc32fast::hash(&blob));
            offsets.push(self.index.file_len);
            let r = self.write_blob_part(&blob);
            self.blob = blob;
            r?;
            self.index.file_len += layout.blob_bytes as u64;
        }
        self.index.layers.push(ExpertLayerIndex {
            shape,
            layout,
            offsets,
            crc,
        });
        Ok(())
    }

    /// Writes header and index, syncs and renames the file to its final name. Returns the index.
    pub fn finish(self) -> Result<ExpertIndex> {
        if self.index.layers.len() != self.shapes.len() {
            return Err(StoreError::Invalid(format!(
                "finish after {} of {} layers",
                self.index.layers.len(),
                self.shapes.len()
            )));
        }
        let index = self.index.encode();
        let header = encode_header(
            &EXPERT_STORE,
            &index,
            ExpertIndex::data_offset(&self.shapes),
            self.index.file_len,
        );
        let tmp = self.tmp.clone();
        let wr = |source| StoreError::Write {
            path: tmp.clone(),
            source,
        };
        let out = self
            .out
            .ok_or_else(|| StoreError::Invalid("writer already finished".into()))?;
        let mut file = out.into_inner().map_err(|e| wr(e.into_error()))?;
        file.seek(SeekFrom::Start(0)).map_err(wr)?;
        file.write_all(&header).map_err(wr)?;
        file.write_all(&index).map_err(wr)?;
        file.commit().map_err(write_error)?;
        Ok(self.index)
    }
}
