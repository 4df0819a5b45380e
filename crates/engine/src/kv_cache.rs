//! The KV cache of one sequence: every layer's keys and values, grown a chunk at a time.

use kernels_neon::{KvChunks, KvFormat};

use crate::error::{kernel, EngineError, Result};
use crate::model::Model;

/// Positions per chunk of a [`KvCache`]: the cache grows by one chunk of every layer's keys and
/// values at a time (the last chunk is cut to the capacity).
pub const KV_CHUNK: usize = 256;

/// Keys and values of every layer for the positions seen so far, in the cache's [`KvFormat`]
/// (f32, f16 or `q8_0` rows of `kv_dim` elements). Memory is allocated a chunk of [`KV_CHUNK`]
/// positions at a time as positions are added and given back when they are forgotten, so it
/// follows the positions held, never more than [`crate::ModelConfig::kv_cache_bytes`] at the
/// capacity.
#[derive(Clone)]
pub struct KvCache {
    pub(crate) format: KvFormat,
    /// `[layer][chunk]` bytes: chunk `c` holds positions `c * KV_CHUNK..`.
    pub(crate) k: Vec<Vec<Vec<u8>>>,
    pub(crate) v: Vec<Vec<Vec<u8>>>,
    pub(crate) len: usize,
    pub(crate) capacity: usize,
    pub(crate) kv_dim: usize,
    pub(crate) row_bytes: usize,
}

impl KvCache {
    /// An empty f32 cache for `model` that can hold `capacity` positions. Memory grows as positions
    /// are added.
    pub fn new(model: &Model<'_>, capacity: usize) -> Self {
        let (n, kv_dim) = (model.config.n_layers, model.config.kv_dim());
        KvCache {
            format: KvFormat::F32,
            k: vec![Vec::new(); n],
            v: vec![Vec::new(); n],
            len: 0,
            capacity,
            kv_dim,
            row_bytes: kv_dim * 4,
        }
    }

    /// An empty cache of `format` for `model` that can hold `capacity` positions. A `q8_0` cache
    /// needs a head size that is a multiple of 32 (its blocks must not straddle heads).
    pub fn with_format(model: &Model<'_>, capacity: usize, format: KvFormat) -> Result<Self> {
        let cfg = &model.config;
        let kv_dim = cfg.kv_dim();
        let row_bytes = format
            .row_bytes(kv_dim)
            .filter(|_| cfg.head_dim % format.block() == 0)
            .ok_or_else(|| {
                EngineError::Request(format!(
                    "{}: a {format} KV cache needs a head size that is a multiple of {} (this model's is {}): use --cache-type f16",
                    model.path().display(),
                    format.block(),
                    cfg.head_dim
                ))
            })?;
        let n = cfg.n_layers;
        Ok(KvCache {
            format,
            k: vec![Vec::new(); n],
            v: vec![Vec::new(); n],
            len: 0,
            capacity,
            kv_dim,
            row_bytes,
        })
    }

    /// How keys and values are stored.
    pub fn format(&self) -> KvFormat {
        self.format
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets every position after the first `len`, and gives back the chunks no position held
    /// needs any more.
    pub fn truncate(&mut self, len: usize) {
        self.len = len.min(self.len);
        let chunks = self.len.div_ceil(KV_CHUNK);
        for layer in self.k.iter_mut().chain(self.v.iter_mut()) {
            layer.truncate(chunks);
        }
    }

    /// Bytes held by keys and values (the chunks allocated).
    pub fn bytes(&self) -> usize {
        self.k
            .iter()
            .chain(self.v.iter())
            .flatten()
            .map(|c| c.len())
            .sum()
    }

    /// Allocates the chunks that positions `..end` (at most the capacity) need in every layer.
    pub(crate) fn grow_to(&mut self, end: usize) {
        let chunks = end.div_ceil(KV_CHUNK);
        for layer in self.k.iter_mut().chain(self.v.iter_mut()) {
            while layer.len() < chunks {
                let first = layer.len() * KV_CHUNK;
                let positions = KV_CHUNK.min(self.capacity - first);
                layer.push(vec![0u8; positions * self.row_bytes]);
            }
        }
    }

    /// Writes the rows of `keys` and `values` (`n × kv_dim` f32 each) of layer `layer` as positions
    /// `start..start + n` (allocated by [`grow_to`](Self::grow_to)).
    pub(crate) fn write(
        &mut self,
        layer: usize,
        start: usize,
        keys: &[f32],
        values: &[f32],
    ) -> Result<()> {
        let (f, rb, kvd) = (self.format, self.row_bytes, self.kv_dim);
        for (chunks, rows) in [(&mut self.k[layer], keys), (&mut self.v[layer], values)] {
            for (t, row) in rows.chunks_exact(kvd).enumerate() {
                let pos = start + t;
                let chunk = &mut chunks[pos / KV_CHUNK];
                let at = (pos % KV_CHUNK) * rb;
                kernels_neon::kv_encode(f, row, &mut chunk[at..at + rb])
                    .map_err(kernel("kv cache write"))?;
            }
        }
        Ok(())
    }

    /// Layer `layer`'s keys and values, for the attention kernel.
    pub(crate) fn layer(&self, layer: usize) -> (KvChunks<'_>, KvChunks<'_>) {
        let view = |chunks| KvChunks {
            format: self.format,
            chunk: KV_CHUNK,
            chunks,
        };
        (view(&self.k[layer][..]), view(&self.v[layer][..]))
    }
}
