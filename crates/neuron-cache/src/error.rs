//! The crate's one error type.

use std::fmt;

/// A region of the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Region {
    /// Reserved bytes (attention weights, KV cache, predictors, embeddings): never evicted.
    Fixed,
    /// Whole neuron clusters, cluster-level LRU.
    Hot,
    /// Single neurons, two-queue LRU.
    Cold,
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Region::Fixed => "fixed",
            Region::Hot => "hot",
            Region::Cold => "cold",
        })
    }
}

/// Everything that can go wrong in `neuron-cache`; each variant says which entry or region, and the sizes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    /// An insertion does not fit even after evicting every unpinned entry of its region.
    #[error(
        "{region} region cannot take {key} ({needed} bytes): capacity {capacity} bytes, {used} used, {pinned} pinned"
    )]
    BudgetExhausted {
        /// Region inserted into.
        region: Region,
        /// The entry, e.g. `layer 3 neuron 17`.
        key: String,
        /// Its size.
        needed: usize,
        /// Region capacity.
        capacity: usize,
        /// Bytes resident in the region.
        used: usize,
        /// Of those, bytes pinned.
        pinned: usize,
    },
    /// `fixed + hot` would exceed the budget.
    #[error(
        "layout does not fit the budget: fixed {fixed} + hot {hot} bytes > budget {budget} bytes"
    )]
    Layout {
        /// Requested fixed bytes.
        fixed: usize,
        /// Requested hot-region bytes.
        hot: usize,
        /// The budget.
        budget: usize,
    },
    /// A region cannot shrink below its pinned bytes.
    #[error("cannot shrink the {region} region to {capacity} bytes: {pinned} bytes are pinned")]
    Pinned {
        /// The region.
        region: Region,
        /// The capacity asked for.
        capacity: usize,
        /// Bytes pinned in it.
        pinned: usize,
    },
    /// `unpin` of an entry that is not resident or not pinned.
    #[error("{key} is not pinned")]
    NotPinned {
        /// The entry.
        key: String,
    },
    /// Removing an entry that is pinned.
    #[error("{key} is pinned and cannot be removed")]
    InUse {
        /// The entry.
        key: String,
    },
    /// An expert does not fit its layer's share beside the pinned and in-use experts.
    #[error("{key} ({needed} bytes) does not fit its layer's share of {share} bytes: {used} used, {held} pinned or in use")]
    ExpertBudget {
        /// The expert (or layer), e.g. `layer 3 expert 17`.
        key: String,
        /// Its size.
        needed: usize,
        /// The layer's share.
        share: usize,
        /// Bytes resident in the layer.
        used: usize,
        /// Of those, bytes that cannot be evicted.
        held: usize,
    },
    /// Layer shares that do not fit the budget or do not match the layers.
    #[error("{layers} layer shares of {total} bytes for a cache of {expected} layers and a budget of {budget} bytes")]
    Shares {
        /// Shares given.
        layers: usize,
        /// Their sum.
        total: usize,
        /// The budget.
        budget: usize,
        /// Layers of the cache.
        expected: usize,
    },
    /// An expert index outside its layer.
    #[error("{key} is outside the cache ({experts} experts in that layer)")]
    NoSuchExpert {
        /// The expert.
        key: String,
        /// Experts of its layer.
        experts: usize,
    },
    /// `release_fixed` of more than was reserved.
    #[error("releasing {bytes} fixed bytes, but only {reserved} are reserved")]
    FixedUnderflow {
        /// Bytes asked to release.
        bytes: usize,
        /// Bytes reserved.
        reserved: usize,
    },
}

/// `Result` with [`CacheError`].
pub type Result<T> = std::result::Result<T, CacheError>;
