//! The paper's Algorithm 1 transcribed line by line, in real numbers (`f64`): the tests' oracle
//! for the water-filling in `waterfill.rs`. Never used outside the tests.

/// One generation: buckets `b` (vacant slots have speed 0 and are left alone), speeds `v`
/// (cores), bucket size `big_b`, interval `dt`. Returns the surplus left when the loop ends
/// (the tokens discarded) and the number of passes of the second step.
pub(crate) fn algorithm1(b: &mut [f64], v: &[f64], big_b: f64, dt: f64) -> (f64, usize) {
    let set: Vec<usize> = (0..b.len()).filter(|&i| v[i] > 0.0).collect();
    // ▶ Distribute tokens to buckets and count surplus tokens:
    // 1: r_i ← v_i·Δt
    let r: Vec<f64> = v.iter().map(|&v_i| v_i * dt).collect();
    // 2: r′ ← 0
    let mut r1 = 0.0;
    // 3: for all i ∈ I do
    for &i in &set {
        // 4: r′ ← r′ + r_i − min(B − b_i, r_i)
        r1 += r[i] - (big_b - b[i]).min(r[i]);
        // 5: b_i ← min(B, b_i + r_i)
        b[i] = big_b.min(b[i] + r[i]);
    }
    // ▶ Distribute surplus tokens fairly until none are left or all buckets are full:
    let mut passes = 0;
    // 7: while r′ > 0 and ∃ i ∈ I : b_i < B do
    while r1 > 0.0 && set.iter().any(|&i| b[i] < big_b) {
        passes += 1;
        assert!(passes <= set.len() + 1, "Algorithm 1 does not terminate");
        // 8: J ← {i ∈ S : b_i < B}
        let j_set: Vec<usize> = set.iter().copied().filter(|&i| b[i] < big_b).collect();
        let v_j_sum: f64 = j_set.iter().map(|&j| v[j]).sum();
        // 9: r″ ← 0
        let mut r2 = 0.0;
        // 10: for all j ∈ J do
        for &j in &j_set {
            // 11: r_j ← r′ · v_j / Σ_{i∈J} v_i
            let r_j = r1 * v[j] / v_j_sum;
            // 12: r″ ← r″ + r_j − min(B − b_j, r_j)
            r2 += r_j - (big_b - b[j]).min(r_j);
            // 13: b_j ← min(B, b_j + r_j)
            b[j] = big_b.min(b[j] + r_j);
        }
        // 15: r′ ← r″
        r1 = r2;
    }
    (r1, passes)
}
