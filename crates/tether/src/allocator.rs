//! The process's allocator: mimalloc, asked for alignment only where a layout needs more than
//! every block has.
//!
//! glibc's allocator spent a fifth of the server's time per tool call (malloc, free and
//! `malloc_consolidate` in `perf`); mimalloc's thread-local free lists cost a fraction of that.
//! Through its aligned entry points, as the `mimalloc` crate calls it for every layout, each
//! allocation also checks its alignment and takes a slower path from 1 KiB; a tool call makes
//! about 120 allocations, almost all aligned to at most a word, and this costs it about 2,900
//! instructions (2.7%; docs/benchmarks.md).
//!
//! This is the one module of the workspace with `unsafe` code: the allocator interface is unsafe
//! by definition.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// Every block mimalloc hands out is aligned to a word at least: its size classes are whole
/// words, laid out from a page start that is aligned further.
const BLOCK_ALIGN: usize = std::mem::size_of::<usize>();

/// Whether every block has `layout`'s alignment, so that mimalloc's plain entry points serve it.
fn plain(layout: Layout) -> bool {
    layout.align() <= BLOCK_ALIGN
}

/// Allocates `layout` through `unaligned` where [`plain`], else through `aligned`.
///
/// # Safety
/// `layout` has a nonzero size, as `GlobalAlloc` guarantees its callers ask for.
unsafe fn allocate(
    layout: Layout,
    unaligned: unsafe extern "C" fn(usize) -> *mut c_void,
    aligned: unsafe extern "C" fn(usize, usize) -> *mut c_void,
) -> *mut u8 {
    // SAFETY: both entry points take any nonzero size; the aligned one any power of two, which a
    // `Layout`'s alignment is.
    unsafe { if plain(layout) { unaligned(layout.size()) } else { aligned(layout.size(), layout.align()) }.cast() }
}

/// mimalloc, through `mi_malloc` for layouts whose alignment every block has, and through its
/// aligned entry points for the others.
pub struct Mimalloc;

// SAFETY: each method hands the layout's size to mimalloc, whose blocks are at least that large
// and aligned to a word; a layout aligned further goes to the aligned entry point with its
// alignment. Blocks are freed and resized only through mimalloc, which finds their size itself.
unsafe impl GlobalAlloc for Mimalloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: `GlobalAlloc`'s callers never ask for zero bytes.
        unsafe { allocate(layout, mi::mi_malloc, mi::mi_malloc_aligned) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe { allocate(layout, mi::mi_zalloc, mi::mi_zalloc_aligned) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator, so from mimalloc.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`'s alignment, which the block
        // keeps: mimalloc's plain resize where every block has it, its aligned one above.
        unsafe {
            if plain(layout) {
                mi::mi_realloc(ptr.cast(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every alignment up to a page, at sizes around each size class's edges and across the
    /// 1 KiB line where mimalloc's aligned path changes, several blocks of each so that they sit
    /// at different places in their page: each block is aligned, zeroed when asked, and keeps its
    /// bytes when resized.
    #[test]
    fn blocks_are_aligned_zeroed_and_kept_across_sizes_and_alignments() {
        let allocator = Mimalloc;
        let mut held = Vec::new();
        for align in (0..=12).map(|shift| 1usize << shift) {
            for size in (1..=80).chain([127, 128, 129, 1000, 1024, 1025, 4095, 4097, 70_000]) {
                let layout = Layout::from_size_align(size, align).expect("a valid layout");
                let grown_layout = Layout::from_size_align(size * 2 + 8, align).expect("a valid layout");
                for _ in 0..8 {
                    // SAFETY: layouts of nonzero size; each block is freed below with its own.
                    unsafe {
                        let zeroed = allocator.alloc_zeroed(layout);
                        assert!(!zeroed.is_null());
                        assert_eq!(zeroed as usize % align, 0, "alloc_zeroed of {layout:?}");
                        assert!(std::slice::from_raw_parts(zeroed, size).iter().all(|&b| b == 0));
                        let block = allocator.alloc(layout);
                        assert_eq!(block as usize % align, 0, "alloc of {layout:?}");
                        block.write_bytes(0xa5, size);
                        let grown = allocator.realloc(block, layout, grown_layout.size());
                        assert_eq!(grown as usize % align, 0, "realloc of {layout:?}");
                        assert!(std::slice::from_raw_parts(grown, size).iter().all(|&b| b == 0xa5));
                        held.push((zeroed, layout));
                        held.push((grown, grown_layout));
                    }
                }
            }
        }
        for (ptr, layout) in held {
            // SAFETY: each was allocated above with this layout and is freed once.
            unsafe { allocator.dealloc(ptr, layout) };
        }
    }
}
