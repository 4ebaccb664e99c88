//! The simple IMIX traffic mix: inner IP packets of 40, 576 and 1500 bytes in the proportion
//! 7:4:1 (the classic "simple IMIX", mean 340.3 bytes). Packets are sent in blocks of one size
//! (56 x 40, 32 x 576, 8 x 1500 per cycle of 96) so that the load generator can send each
//! block as a few UDP GSO trains; over any cycle the mix is exact.

/// The sizes, smallest first.
pub(crate) const SIZES: [u16; 3] = [40, 576, 1500];
/// Their weights.
pub(crate) const WEIGHTS: [u64; 3] = [7, 4, 1];
/// The largest IMIX packet.
pub(crate) const MAX: u16 = 1500;
/// Packets per block of the smallest weight (blocks are `WEIGHT * BLOCK` long).
const BLOCK: u64 = 8;
/// Packets per cycle.
pub(crate) const CYCLE: u64 = (7 + 4 + 1) * BLOCK;

/// The size of packet `i` of a run.
pub(crate) fn size_of(i: u64) -> u16 {
    let mut pos = i % CYCLE;
    for (size, weight) in SIZES.iter().zip(WEIGHTS) {
        let len = weight * BLOCK;
        if pos < len {
            return *size;
        }
        pos -= len;
    }
    // The weights sum to CYCLE / BLOCK, so the loop always returns.
    MAX
}

/// The mean packet length: (7 x 40 + 4 x 576 + 1500) / 12.
pub(crate) fn mean() -> f64 {
    let total: u64 = SIZES
        .iter()
        .zip(WEIGHTS)
        .map(|(s, w)| u64::from(*s) * w)
        .sum();
    let count: u64 = WEIGHTS.iter().sum();
    total as f64 / count as f64
}

/// A one-line description for reports.
pub(crate) fn describe() -> String {
    format!(
        "simple IMIX: inner IP packets of 40, 576 and 1500 bytes in the proportion 7:4:1 (mean {:.1} bytes), sent in blocks of 56/32/8",
        mean()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_is_seven_four_one() {
        let mut counts = [0u64; 3];
        for i in 0..CYCLE * 10 {
            let s = size_of(i);
            let k = SIZES.iter().position(|&x| x == s).expect("an IMIX size");
            counts[k] += 1;
        }
        assert_eq!(counts, [560, 320, 80]);
        assert!((mean() - 340.333).abs() < 0.01);
        assert_eq!(size_of(0), 40);
        assert_eq!(size_of(55), 40);
        assert_eq!(size_of(56), 576);
        assert_eq!(size_of(88), 1500);
        assert_eq!(size_of(95), 1500);
        assert_eq!(size_of(96), 40);
    }

    #[test]
    fn mean_of_any_whole_cycle_is_exact() {
        let total: u64 = (1000..1000 + CYCLE).map(|i| u64::from(size_of(i))).sum();
        assert!((total as f64 / CYCLE as f64 - mean()).abs() < 1e-9);
    }
}
