//! Decomposing a byte range of a row-major 3-D array into index ranges.

use std::ops::Range;

/// Index ranges covered by a byte range of an array `[outer][middle][inner]`
/// (inner = bytes), and whether the range is exactly their product.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Box3 {
    pub outer: Range<u64>,
    pub middle: Range<u64>,
    pub inner: Range<u64>,
    pub rect: bool,
}

/// Decomposes `[start, start + len)` of an array with `middle` rows of
/// `inner` bytes per outer index. `len` must be at least 1.
pub(crate) fn decompose(start: u64, len: u64, middle: u64, inner: u64) -> Box3 {
    let split = |x: u64| (x / (middle * inner), (x / inner) % middle, x % inner);
    let (i0, j0, k0) = split(start);
    let (i1, j1, k1) = split(start + len - 1);
    let full_inner = k0 == 0 && k1 == inner - 1;
    if i0 == i1 && j0 == j1 {
        return Box3 {
            outer: i0..i0 + 1,
            middle: j0..j0 + 1,
            inner: k0..k1 + 1,
            rect: true,
        };
    }
    if i0 == i1 {
        return Box3 {
            outer: i0..i0 + 1,
            middle: j0..j1 + 1,
            inner: 0..inner,
            rect: full_inner,
        };
    }
    Box3 {
        outer: i0..i1 + 1,
        middle: 0..middle,
        inner: 0..inner,
        rect: full_inner && j0 == 0 && j1 == middle - 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_decompose_into_rectangles_or_ragged_bounds() {
        // Array [4][3][8].
        assert_eq!(
            decompose(26, 4, 3, 8),
            Box3 {
                outer: 1..2,
                middle: 0..1,
                inner: 2..6,
                rect: true
            }
        );
        assert_eq!(
            decompose(24, 16, 3, 8),
            Box3 {
                outer: 1..2,
                middle: 0..2,
                inner: 0..8,
                rect: true
            }
        );
        assert_eq!(
            decompose(24, 48, 3, 8),
            Box3 {
                outer: 1..3,
                middle: 0..3,
                inner: 0..8,
                rect: true
            }
        );
        assert_eq!(
            decompose(32, 24, 3, 8),
            Box3 {
                outer: 1..3,
                middle: 0..3,
                inner: 0..8,
                rect: false
            }
        );
        assert_eq!(
            decompose(25, 8, 3, 8),
            Box3 {
                outer: 1..2,
                middle: 0..2,
                inner: 0..8,
                rect: false
            }
        );
    }
}
