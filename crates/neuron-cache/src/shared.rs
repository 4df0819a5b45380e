//! [`SharedNeuronCache`]: the cache behind a mutex, with pin guards.

use std::ops::Deref;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use crate::{CacheStats, ClusterId, NeuronCache, NeuronId, Result};

/// A [`NeuronCache`] shared between compute threads and the I/O thread: one `parking_lot::Mutex`
/// around the whole cache (every operation is O(1) apart from skipping pinned entries at eviction, so
/// critical sections are short). Cloning shares the same cache.
///
/// Lookups return guards that keep the entry pinned (never evicted) until dropped.
#[derive(Clone)]
pub struct SharedNeuronCache {
    inner: Arc<Mutex<NeuronCache>>,
}

impl SharedNeuronCache {
    /// Shares `cache`.
    pub fn new(cache: NeuronCache) -> Self {
        Self {
            inner: Arc::new(Mutex::new(cache)),
        }
    }

    /// Locks the cache for anything else (layout changes, statistics, several operations at once).
    /// Do not drop a guard of this cache while holding the lock (the guard's drop takes it).
    pub fn lock(&self) -> MutexGuard<'_, NeuronCache> {
        self.inner.lock()
    }

    /// [`NeuronCache::stats`].
    pub fn stats(&self) -> CacheStats {
        self.inner.lock().stats()
    }

    /// [`NeuronCache::insert_neuron`].
    pub fn insert_neuron(&self, id: NeuronId, data: Arc<[u8]>) -> Result<()> {
        self.inner.lock().insert_neuron(id, data)
    }

    /// [`NeuronCache::insert_neuron_pinned`], returning a guard that unpins on drop.
    pub fn insert_neuron_pinned(&self, id: NeuronId, data: Arc<[u8]>) -> Result<NeuronGuard> {
        let data = self.inner.lock().insert_neuron_pinned(id, data)?;
        Ok(NeuronGuard {
            cache: self.inner.clone(),
            id,
            data,
        })
    }

    /// Looks a neuron up and pins it while the guard lives.
    pub fn get_neuron(&self, id: NeuronId) -> Option<NeuronGuard> {
        let data = self.inner.lock().pin_neuron(id)?;
        Some(NeuronGuard {
            cache: self.inner.clone(),
            id,
            data,
        })
    }

    /// [`NeuronCache::insert_cluster`].
    pub fn insert_cluster(&self, id: ClusterId, data: Arc<[u8]>) -> Result<()> {
        self.inner.lock().insert_cluster(id, data)
    }

    /// [`NeuronCache::insert_cluster_pinned`], returning a guard that unpins on drop.
    pub fn insert_cluster_pinned(&self, id: ClusterId, data: Arc<[u8]>) -> Result<ClusterGuard> {
        let data = self.inner.lock().insert_cluster_pinned(id, data)?;
        Ok(ClusterGuard {
            cache: self.inner.clone(),
            id,
            data,
        })
    }

    /// Looks a cluster up and pins it while the guard lives.
    pub fn get_cluster(&self, id: ClusterId) -> Option<ClusterGuard> {
        let data = self.inner.lock().pin_cluster(id)?;
        Some(ClusterGuard {
            cache: self.inner.clone(),
            id,
            data,
        })
    }
}

/// A pinned neuron's bytes; the neuron stays resident until the guard is dropped.
pub struct NeuronGuard {
    cache: Arc<Mutex<NeuronCache>>,
    id: NeuronId,
    data: Arc<[u8]>,
}

impl NeuronGuard {
    /// Which neuron.
    pub fn id(&self) -> NeuronId {
        self.id
    }
}

impl Deref for NeuronGuard {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for NeuronGuard {
    fn drop(&mut self) {
        // The entry is pinned by this guard, so it is resident and pinned: unpin cannot fail.
        let _ = self.cache.lock().unpin_neuron(self.id);
    }
}

/// A pinned cluster's bytes; the cluster stays resident until the guard is dropped.
pub struct ClusterGuard {
    cache: Arc<Mutex<NeuronCache>>,
    id: ClusterId,
    data: Arc<[u8]>,
}

impl ClusterGuard {
    /// Which cluster.
    pub fn id(&self) -> ClusterId {
        self.id
    }
}

impl Deref for ClusterGuard {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        // Pinned by this guard, hence resident: unpin cannot fail.
        let _ = self.cache.lock().unpin_cluster(self.id);
    }
}
