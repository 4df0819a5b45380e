//! Each layer's share of an expert cache when no plan sets them: equal parts, in whole reads.

/// Shares of `budget` bytes for layers whose reads are `unit[l]` bytes each (0: a layer without
/// experts): each layer's equal part rounded down to whole reads, then the bytes that the rounding
/// left, one read at a time, to the layer holding the fewest reads (the first of those) while a
/// read fits, and what is left after that spread evenly. Equal parts alone waste up to a read a
/// layer, and all of a layer's part where one read is larger than it: the SYNTHETIC Mixtral-width
/// ReLU file's 112 MiB experts under a 349 MiB cache of 4 layers held none (87 MiB parts).
pub(super) fn whole_read_shares(unit: &[usize], budget: usize) -> Vec<usize> {
    let with: Vec<usize> = (0..unit.len()).filter(|&l| unit[l] > 0).collect();
    let mut shares = vec![0; unit.len()];
    if with.is_empty() {
        return shares;
    }
    let part = budget / with.len();
    let mut reads = vec![0usize; unit.len()];
    let mut left = budget;
    for &l in &with {
        reads[l] = part / unit[l];
        left -= reads[l] * unit[l];
    }
    while let Some(l) = with
        .iter()
        .copied()
        .filter(|&l| unit[l] <= left)
        .min_by_key(|&l| (reads[l], l))
    {
        reads[l] += 1;
        left -= unit[l];
    }
    let extra = left / with.len();
    for &l in &with {
        shares[l] = reads[l] * unit[l] + extra;
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::whole_read_shares;

    #[test]
    fn reads_larger_than_an_equal_part_go_whole_to_the_first_layers() {
        // 4 layers of 112-byte reads under 349: equal parts (87) would hold none.
        let s = whole_read_shares(&[112, 112, 112, 112], 349);
        assert_eq!(s, vec![115, 115, 115, 3]);
    }

    #[test]
    fn what_equal_parts_round_away_buys_more_reads_and_nothing_is_overspent() {
        // Parts of 250 hold 2 reads of 100 each; the 4 x 50 left buy two more.
        let s = whole_read_shares(&[100, 0, 100, 100, 100], 1000);
        assert_eq!(s, vec![300, 0, 300, 200, 200]);
        assert!(s.iter().sum::<usize>() <= 1000);
        // Exact multiples change nothing; an unbounded budget does not overflow.
        assert_eq!(whole_read_shares(&[10, 10], 100), vec![50, 50]);
        let big = whole_read_shares(&[7, 9], usize::MAX);
        assert!(big
            .iter()
            .try_fold(0usize, |a, &b| a.checked_add(b))
            .is_some());
        assert_eq!(whole_read_shares(&[0, 0], 100), vec![0, 0]);
    }
}
