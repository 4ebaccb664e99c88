//! Private helpers shared by the packet views: big-endian field access and length checks.
//! Callers index only after a length check, so these panic only on a caller bug.

use crate::error::WireError;

/// Reads a big-endian u16 at `at`.
#[inline]
pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Reads a big-endian u32 at `at`.
#[inline]
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Writes a big-endian u16 at `at`.
#[inline]
pub(crate) fn set_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Writes a big-endian u32 at `at`.
#[inline]
pub(crate) fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// `Truncated` unless `got >= need`.
#[inline]
pub(crate) fn need(what: &'static str, got: usize, need: usize) -> Result<(), WireError> {
    if got < need {
        Err(WireError::Truncated { what, need, got })
    } else {
        Ok(())
    }
}

/// `BufferTooSmall` unless `got >= need`.
#[inline]
pub(crate) fn room(what: &'static str, got: usize, need: usize) -> Result<(), WireError> {
    if got < need {
        Err(WireError::BufferTooSmall { what, need, got })
    } else {
        Ok(())
    }
}
