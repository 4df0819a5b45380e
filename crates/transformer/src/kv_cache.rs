//! The KV cache of one sequence: every layer's keys and values, grown a chunk at a time.

use kernels_neon::{KvChunks, KvFormat};

use crate::config::ModelConfig;
use crate::error::{kernel, ModelError, Result};
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
                ModelError::Request(format!(
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

    /// Makes this cache hold `from`'s positions `len()..upto` (after its own first `len()`, which
    /// are kept): a copy of the rows, so that a cache that followed `from` for a while (a
    /// speculative draft on the same model) is brought back in step with it. Refused, the cache
    /// unchanged, where the two differ in layers, format or width, or `from` holds fewer than
    /// `upto` positions or this cache cannot.
    pub fn extend_from(&mut self, from: &KvCache, upto: usize) -> Result<()> {
        let start = self.len;
        if from.format != self.format
            || from.kv_dim != self.kv_dim
            || from.k.len() != self.k.len()
            || upto > from.len
            || upto > self.capacity
        {
            return Err(ModelError::Request(format!(
                "a KV cache of {} positions ({} layers, {} wide, {}) cannot take positions {start}..{upto} of one of {} ({} layers, {} wide, {})",
                self.capacity, self.k.len(), self.kv_dim, self.format, from.len, from.k.len(), from.kv_dim, from.format
            )));
        }
        if upto <= start {
            return Ok(());
        }
        self.grow_to(upto);
        let rb = self.row_bytes;
        for (dst, src) in self
            .k
            .iter_mut()
            .zip(&from.k)
            .chain(self.v.iter_mut().zip(&from.v))
        {
            for pos in start..upto {
                let (c, at) = (pos / KV_CHUNK, (pos % KV_CHUNK) * rb);
                dst[c][at..at + rb].copy_from_slice(&src[c][at..at + rb]);
            }
        }
        self.len = upto;
        Ok(())
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

impl ModelConfig {
    /// Bytes of a KV cache of `format` holding `positions` positions: keys and values (a row of
    /// `kv_dim` elements each: 4 bytes an element in f32, 2 in f16, 34 bytes per 32 in `q8_0`) of
    /// every layer. The one place the KV-cache size is computed; a [`KvCache`] of capacity
    /// `positions` never allocates more.
    pub fn kv_cache_bytes(&self, positions: usize, format: KvFormat) -> u64 {
        let width = self.kv_dim().next_multiple_of(format.block());
        let row = format.row_bytes(width).unwrap_or(usize::MAX) as u64;
        let per_position = (self.n_layers as u64 * 2).saturating_mul(row);
        per_position.saturating_mul(positions as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(n_layers: usize, n_kv_heads: usize, head_dim: usize) -> ModelConfig {
        ModelConfig {
            arch: crate::config::Arch::from_gguf("llama").expect("llama is registered"),
            n_layers,
            d_model: n_kv_heads * head_dim * 3,
            d_ff: 1536,
            n_heads: n_kv_heads * 3,
            n_kv_heads,
            head_dim,
            vocab_size: 49152,
            rms_eps: 1e-5,
            rope_base: 10000.0,
            rope_dim: head_dim,
            rope_style: Default::default(),
            activation: crate::config::Activation::Silu,
            context_length: 8192,
            ffn_store: None,
            moe: None,
        }
    }

    #[test]
    fn kv_cache_bytes_counts_keys_and_values_of_every_layer_at_the_cache_type() {
        // SmolLM2-135M: 30 layers, 3 KV heads of 64: 30 * 192 * 2 * 4 = 46,080 bytes per position
        // in f32, half that in f16, and 6 blocks of 34 bytes per row in q8_0: 30 * 2 * 204.
        let c = config(30, 3, 64);
        assert_eq!(c.kv_cache_bytes(1, KvFormat::F32), 46_080);
        assert_eq!(c.kv_cache_bytes(4096, KvFormat::F32), 46_080 * 4096);
        assert_eq!(c.kv_cache_bytes(0, KvFormat::F32), 0);
        assert_eq!(c.kv_cache_bytes(1, KvFormat::F16), 23_040);
        assert_eq!(c.kv_cache_bytes(1000, KvFormat::Q8_0), 12_240_000);
        // A row that is not whole blocks is counted as the blocks that would hold it.
        let odd = config(2, 1, 40);
        assert_eq!(odd.kv_cache_bytes(1, KvFormat::Q8_0), 2 * 2 * 2 * 34);
    }
}
