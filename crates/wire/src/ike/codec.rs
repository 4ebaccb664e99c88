//! Reading and writing helpers for the IKEv2 codec: a [`Reader`] that tracks its position, hands
//! out sub-readers for length-prefixed parts and rejects trailing bytes, and [`LenField`], a
//! length placeholder filled in by an explicit [`LenField::finish`] (the rustls `msgs/codec.rs`
//! pattern).

use super::IkeWireError;

/// A cursor over a byte slice. Every read is bounds-checked and returns
/// [`IkeWireError::Truncated`] naming the structure being read instead of panicking.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader over `buf`; `what` names the structure in errors.
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, pos: 0, what }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// True when every byte was read.
    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    /// Bytes read so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Takes the next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], IkeWireError> {
        if self.remaining() < n {
            return Err(IkeWireError::Truncated {
                what: self.what,
                needed: n,
                available: self.remaining(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// A reader over the next `n` bytes, consumed from this one.
    pub fn sub(&mut self, n: usize, what: &'static str) -> Result<Reader<'a>, IkeWireError> {
        let buf = self.take(n)?;
        Ok(Reader { buf, pos: 0, what })
    }

    /// Everything not yet read.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }

    /// Fails with [`IkeWireError::TrailingBytes`] unless every byte was read.
    pub fn finish(&self) -> Result<(), IkeWireError> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(IkeWireError::TrailingBytes {
                what: self.what,
                count: self.remaining(),
            })
        }
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8, IkeWireError> {
        Ok(self.take(1)?[0])
    }

    /// A big-endian `u16`.
    pub fn u16(&mut self) -> Result<u16, IkeWireError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A big-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, IkeWireError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A big-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, IkeWireError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
}

/// A 16- or 32-bit big-endian length placeholder in an output buffer. The length counts the
/// bytes from `start` to the end of the buffer when [`finish`](Self::finish) is called.
#[derive(Debug)]
#[must_use = "a length field must be finished"]
pub struct LenField {
    at: usize,
    start: usize,
    wide: bool,
    what: &'static str,
}

impl LenField {
    /// Writes a 2-byte placeholder; the length will count from `start` (an offset in `out`).
    pub fn u16(out: &mut Vec<u8>, start: usize, what: &'static str) -> Self {
        let at = out.len();
        out.extend_from_slice(&[0, 0]);
        Self {
            at,
            start,
            wide: false,
            what,
        }
    }

    /// Writes a 4-byte placeholder; the length will count from `start` (an offset in `out`).
    pub fn u32(out: &mut Vec<u8>, start: usize, what: &'static str) -> Self {
        let at = out.len();
        out.extend_from_slice(&[0, 0, 0, 0]);
        Self {
            at,
            start,
            wide: true,
            what,
        }
    }

    /// Fills in the length. Fails if it does not fit the field.
    pub fn finish(self, out: &mut [u8]) -> Result<(), IkeWireError> {
        let len = out.len().saturating_sub(self.start);
        if self.wide {
            let v = u32::try_from(len).map_err(|_| IkeWireError::BadLength {
                what: self.what,
                length: len,
            })?;
            out[self.at..self.at + 4].copy_from_slice(&v.to_be_bytes());
        } else {
            let v = u16::try_from(len).map_err(|_| IkeWireError::BadLength {
                what: self.what,
                length: len,
            })?;
            out[self.at..self.at + 2].copy_from_slice(&v.to_be_bytes());
        }
        Ok(())
    }
}

/// Checks that a count fits a one-byte field when emitting.
pub(crate) fn count_u8(n: usize, what: &'static str) -> Result<u8, IkeWireError> {
    u8::try_from(n).map_err(|_| IkeWireError::BadLength { what, length: n })
}

/// Checks that a count fits a two-byte field when emitting.
pub(crate) fn count_u16(n: usize, what: &'static str) -> Result<u16, IkeWireError> {
    u16::try_from(n).map_err(|_| IkeWireError::BadLength { what, length: n })
}
