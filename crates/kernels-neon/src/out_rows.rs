//! [`OutPtr`]: where the parallel work items of a batched product write their parts of the
//! token-major output.

/// Raw output pointer shared by the work items of a batched product ([`crate::matmul()`],
/// [`crate::matmul_t()`], [`crate::matvec_batch`], [`crate::matvec_gated`], [`crate::Q40x8`]'s),
/// each writing a disjoint set of elements.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: only used to write disjoint ranges from different threads while
// the owning `&mut [f32]` is borrowed for the whole parallel section.
unsafe impl Send for OutPtr {}
// SAFETY: as above; the pointer itself is never used to create aliasing
// references, only to write to ranges owned by a single work item.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Writes a work item's result `local` (`n` tokens × `nr` rows, token-major) into rows
    /// `r0 .. r0 + nr` of every token's row of `rows` in the output.
    ///
    /// # Safety
    /// The output holds `n * rows` elements and stays mutably borrowed while work items run, and
    /// no other work item writes rows `r0 .. r0 + nr` (row chunks are disjoint).
    pub(crate) unsafe fn write_rows(
        self,
        local: &[f32],
        n: usize,
        rows: usize,
        r0: usize,
        nr: usize,
    ) {
        for t in 0..n {
            let src = &local[t * nr..(t + 1) * nr];
            // SAFETY: in bounds (`t * rows + r0 + nr <= n * rows`) and race-free per the contract.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.0.add(t * rows + r0), nr) };
        }
    }

    /// Rows `r0 .. r0 + nr` of each of the `n` tokens' rows of `rows` in the output, as slices
    /// (made by the work item that writes them: an allocation freed on the thread that made it,
    /// where lists made by the caller and dropped on the workers went through the allocator's
    /// slow paths: `perf` of a three-token verification step of Qwen2.5-Coder-0.5B put 7.9% of
    /// its time over a one-token step's in the allocator, 3.5% with these, 2026-12-06).
    ///
    /// # Safety
    /// As [`OutPtr::write_rows`]; the slices live no longer than that borrow (`'a`) and no two work
    /// items' slices overlap.
    pub(crate) unsafe fn token_rows<'a>(
        self,
        n: usize,
        rows: usize,
        r0: usize,
        nr: usize,
    ) -> Vec<&'a mut [f32]> {
        (0..n)
            .map(|t| {
                // SAFETY: in bounds (`t * rows + r0 + nr <= n * rows`), and no other slice of this
                // or another work item covers these elements (contract).
                unsafe { std::slice::from_raw_parts_mut(self.0.add(t * rows + r0), nr) }
            })
            .collect()
    }
}
