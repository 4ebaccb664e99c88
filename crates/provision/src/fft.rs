//! A radix-2 complex fast Fourier transform, used by the aggregate to convolve long
//! probability vectors (two real vectors ride in one complex transform).
//!
//! Twiddle factors are computed once per size with `sin_cos` of the exact angle (no
//! recurrence), so the rounding error of a transform of size `n` stays near
//! `ε_machine · log₂ n` relative to the vector's norm.

use std::f64::consts::PI;

/// A complex number (just what the transform needs).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Complex {
    re: f64,
    im: f64,
}

impl Complex {
    #[inline]
    fn add(self, other: Self) -> Self {
        Self {
            re: self.re + other.re,
            im: self.im + other.im,
        }
    }

    #[inline]
    fn sub(self, other: Self) -> Self {
        Self {
            re: self.re - other.re,
            im: self.im - other.im,
        }
    }

    #[inline]
    fn mul(self, other: Self) -> Self {
        Self {
            re: self.re * other.re - self.im * other.im,
            im: self.re * other.im + self.im * other.re,
        }
    }
}

/// Twiddle factors for transforms up to a size, grown on demand.
#[derive(Debug, Default)]
pub(crate) struct Fft {
    /// The largest size the table serves (a power of two, or 0).
    size: usize,
    /// `e^{-2πik/size}` for `k < size / 2`.
    twiddles: Vec<Complex>,
}

impl Fft {
    /// An empty table.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Makes the table serve transforms of size `n` (a power of two).
    fn ensure(&mut self, n: usize) {
        if n <= self.size {
            return;
        }
        self.size = n;
        self.twiddles = (0..n / 2)
            .map(|k| {
                let (sin, cos) = (-2.0 * PI * k as f64 / n as f64).sin_cos();
                Complex { re: cos, im: sin }
            })
            .collect();
    }

    /// In-place transform of `data` (length a power of two no larger than the table's size);
    /// `inverse` conjugates the twiddles and does not scale.
    fn transform(&self, data: &mut [Complex], inverse: bool) {
        let n = data.len();
        if n <= 1 {
            return;
        }
        let bits = n.trailing_zeros();
        for i in 0..n {
            let j = i.reverse_bits() >> (usize::BITS - bits);
            if i < j {
                data.swap(i, j);
            }
        }
        let mut len = 2;
        while len <= n {
            let half = len / 2;
            let stride = self.size / len;
            for block in data.chunks_exact_mut(len) {
                let (low, high) = block.split_at_mut(half);
                for (j, (u, v)) in low.iter_mut().zip(high.iter_mut()).enumerate() {
                    let mut w = self.twiddles[j * stride];
                    if inverse {
                        w.im = -w.im;
                    }
                    let t = v.mul(w);
                    *v = u.sub(t);
                    *u = u.add(t);
                }
            }
            len *= 2;
        }
    }

    /// The linear convolution of `a` and `b` (length `a.len() + b.len() - 1`), computed as the
    /// imaginary part of the inverse transform of `Z²` with `z = a + ib`, halved:
    /// `(A + iB)² = A² − B² + 2iAB`. Entries carry rounding noise of about
    /// [`Fft::noise_floor`]; some may be slightly negative.
    pub(crate) fn convolve(&mut self, a: &[f64], b: &[f64]) -> Vec<f64> {
        if a.is_empty() || b.is_empty() {
            return Vec::new();
        }
        let len = a.len() + b.len() - 1;
        let n = len.next_power_of_two();
        self.ensure(n);
        let mut data = vec![Complex::default(); n];
        for (slot, &x) in data.iter_mut().zip(a) {
            slot.re = x;
        }
        for (slot, &y) in data.iter_mut().zip(b) {
            slot.im = y;
        }
        self.transform(&mut data, false);
        for z in data.iter_mut() {
            *z = z.mul(*z);
        }
        self.transform(&mut data, true);
        let scale = 0.5 / n as f64;
        data[..len].iter().map(|z| z.im * scale).collect()
    }

    /// A bound on the rounding noise of [`Fft::convolve`] in each entry: a few machine
    /// epsilons per butterfly level, times the squared norms of the inputs (the size of
    /// `Z²`). Entries below it cannot be told from zero.
    pub(crate) fn noise_floor(a: &[f64], b: &[f64]) -> f64 {
        let n = (a.len() + b.len()).next_power_of_two();
        let levels = f64::from(n.trailing_zeros().max(1));
        let energy: f64 = a.iter().chain(b).map(|x| x * x).sum();
        16.0 * f64::EPSILON * levels * energy
    }
}

/// The linear convolution of `a` and `b` by the definition: exact up to one rounding per
/// product and sum.
pub(crate) fn convolve_direct(a: &[f64], b: &[f64]) -> Vec<f64> {
    if a.is_empty() || b.is_empty() {
        return Vec::new();
    }
    let mut out = vec![0.0; a.len() + b.len() - 1];
    for (i, &x) in a.iter().enumerate() {
        if x == 0.0 {
            continue;
        }
        for (slot, &y) in out[i..].iter_mut().zip(b) {
            *slot += x * y;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random probability vector.
    fn vector(len: usize, seed: u64) -> Vec<f64> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut v: Vec<f64> = (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 11) as f64 / (1u64 << 53) as f64
            })
            .collect();
        let sum: f64 = v.iter().sum();
        v.iter_mut().for_each(|x| *x /= sum);
        v
    }

    #[test]
    fn fft_convolution_matches_direct() {
        let mut fft = Fft::new();
        for (la, lb, seed) in [(1, 1, 1), (1, 7, 2), (3, 5, 3), (100, 100, 4), (513, 77, 5)] {
            let a = vector(la, seed);
            let b = vector(lb, seed + 100);
            let direct = convolve_direct(&a, &b);
            let fast = fft.convolve(&a, &b);
            assert_eq!(direct.len(), fast.len());
            let floor = Fft::noise_floor(&a, &b);
            for (x, y) in direct.iter().zip(&fast) {
                assert!(
                    (x - y).abs() <= floor,
                    "{la}x{lb}: {x} vs {y} (floor {floor})"
                );
            }
        }
    }

    #[test]
    fn smaller_transforms_reuse_a_larger_table() {
        let mut fft = Fft::new();
        let big = fft.convolve(&vector(600, 1), &vector(600, 2));
        assert_eq!(big.len(), 1199);
        let a = vector(10, 3);
        let b = vector(9, 4);
        let direct = convolve_direct(&a, &b);
        let fast = fft.convolve(&a, &b);
        for (x, y) in direct.iter().zip(&fast) {
            assert!((x - y).abs() < 1e-15);
        }
    }

    #[test]
    fn empty_inputs_give_empty_output() {
        let mut fft = Fft::new();
        assert!(fft.convolve(&[], &[1.0]).is_empty());
        assert!(convolve_direct(&[1.0], &[]).is_empty());
    }
}
