//! Fair sharing of the fleet's batch slots: every unfinished batch gets a share of the
//! fleet-wide number of batch runs under way at once, in proportion to its `weight`, by
//! weighted max-min fairness ([`fair_shares`]). A batch that wants less than its share (few
//! items left, a low `max_running`) keeps only what it wants and the rest goes to the others,
//! so one 10,000-item batch cannot starve a 5-item batch submitted after it: the newcomer's
//! share is free as soon as the big batch's runs above its own share end (runs are never
//! stopped to make room; a batch over its share just starts nothing new).

/// What one batch asks of the slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Demand {
    /// Its weight (at least 1; 0 is taken as 1).
    pub weight: u32,
    /// Runs under way now.
    pub running: usize,
    /// Items waiting to start.
    pub queued: usize,
    /// Its own cap on runs under way (`max_running`).
    pub cap: usize,
}

impl Demand {
    /// Runs under way it could use: what it has and what waits, up to its own cap.
    fn wants(&self) -> usize {
        (self.running + self.queued).min(self.cap)
    }

    fn weight(&self) -> u64 {
        u64::from(self.weight.max(1))
    }
}

/// How many runs each batch may have under way, by weighted max-min fairness over `slots`:
/// no batch gets more than it [wants](Demand), the shares sum to at most `slots`, and a batch
/// wanting more than its weighted part gets at least that part (rounded down; the slots left
/// by rounding go one each to the batches with the fewest runs under way, then the earliest
/// in `demands`). A batch may already run more than its share: it then starts nothing.
pub fn fair_shares(slots: usize, demands: &[Demand]) -> Vec<usize> {
    let mut share = vec![0usize; demands.len()];
    let mut open: Vec<usize> = (0..demands.len())
        .filter(|&i| demands[i].wants() > 0)
        .collect();
    let mut left = slots;
    // Everyone wanting no more than its weighted part is served in full; repeat, since what
    // they leave raises everyone else's part.
    loop {
        let total_weight: u64 = open.iter().map(|&i| demands[i].weight()).sum();
        if open.is_empty() || left == 0 {
            return share;
        }
        let (served, rest): (Vec<usize>, Vec<usize>) = open.iter().partition(|&&i| {
            // wants <= left * weight / total_weight, without rounding.
            (demands[i].wants() as u128) * u128::from(total_weight)
                <= (left as u128) * u128::from(demands[i].weight())
        });
        if served.is_empty() {
            break;
        }
        for i in served {
            share[i] = demands[i].wants();
            left -= share[i];
        }
        open = rest;
    }
    // The rest want more than their part: each gets its part rounded down...
    let total_weight: u64 = open.iter().map(|&i| demands[i].weight()).sum();
    let mut given = 0;
    for &i in &open {
        let part = (left as u128) * u128::from(demands[i].weight()) / u128::from(total_weight);
        share[i] = part as usize;
        given += share[i];
    }
    // ...and what rounding left goes one slot each, fewest runs under way first.
    let mut order = open.clone();
    order.sort_by_key(|&i| (demands[i].running, i));
    for &i in order.iter().take(left - given) {
        share[i] += 1;
    }
    share
}

/// How many runs each batch may start now: up to its [fair share](fair_shares), and only into
/// slots that are free (runs under way over all batches never exceed `slots` through a start).
/// Free slots go first to the batches with the fewest runs under way (then the earliest).
pub fn starts(slots: usize, demands: &[Demand]) -> Vec<usize> {
    let shares = fair_shares(slots, demands);
    let mut free = slots.saturating_sub(demands.iter().map(|d| d.running).sum());
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by_key(|&i| (demands[i].running, i));
    let mut out = vec![0usize; demands.len()];
    for i in order {
        let room = shares[i].saturating_sub(demands[i].running).min(free);
        out[i] = room;
        free -= room;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(weight: u32, running: usize, queued: usize, cap: usize) -> Demand {
        Demand {
            weight,
            running,
            queued,
            cap,
        }
    }

    #[test]
    fn one_batch_gets_what_it_wants_up_to_the_slots() {
        assert_eq!(fair_shares(8, &[d(1, 0, 100, 100)]), vec![8]);
        assert_eq!(fair_shares(8, &[d(1, 0, 3, 100)]), vec![3]);
        assert_eq!(fair_shares(8, &[d(1, 0, 100, 2)]), vec![2]);
        assert_eq!(fair_shares(0, &[d(1, 0, 100, 100)]), vec![0]);
    }

    #[test]
    fn a_small_batch_after_a_big_one_gets_its_share_at_once() {
        // The big batch holds every slot; the newcomer is owed half of them.
        let s = fair_shares(8, &[d(1, 8, 10_000, 64), d(1, 0, 5, 64)]);
        assert_eq!(s, vec![4, 4]);
        // A newcomer wanting less than half keeps only that; the rest stays with the big one.
        let s = fair_shares(8, &[d(1, 8, 10_000, 64), d(1, 0, 2, 64)]);
        assert_eq!(s, vec![6, 2]);
    }

    #[test]
    fn weights_split_the_slots_in_proportion() {
        let s = fair_shares(
            12,
            &[d(1, 0, 100, 100), d(2, 0, 100, 100), d(3, 0, 100, 100)],
        );
        assert_eq!(s, vec![2, 4, 6]);
        // A weight of 0 counts as 1, never as nothing.
        let s = fair_shares(4, &[d(0, 0, 100, 100), d(1, 0, 100, 100)]);
        assert_eq!(s, vec![2, 2]);
    }

    #[test]
    fn what_a_capped_batch_leaves_goes_to_the_others() {
        let s = fair_shares(9, &[d(1, 0, 100, 1), d(1, 0, 100, 100), d(1, 0, 100, 100)]);
        assert_eq!(s, vec![1, 4, 4]);
    }

    #[test]
    fn rounding_favours_the_batches_with_the_fewest_runs() {
        // 5 slots, 3 equal batches: 1 each, the 2 left go to the two running least.
        let s = fair_shares(
            5,
            &[d(1, 3, 100, 100), d(1, 0, 100, 100), d(1, 1, 100, 100)],
        );
        assert_eq!(s, vec![1, 2, 2]);
    }

    #[test]
    fn a_newcomer_starts_only_into_slots_the_others_free() {
        // The big batch holds both slots: the newcomer's share waits for a run to end...
        let held = [d(1, 2, 10, 12), d(1, 0, 2, 12)];
        assert_eq!(fair_shares(2, &held), vec![1, 1]);
        assert_eq!(starts(2, &held), vec![0, 0]);
        // ...and takes the first slot that frees; the big batch, over its share, waits.
        let freed = [d(1, 1, 10, 12), d(1, 0, 2, 12)];
        assert_eq!(starts(2, &freed), vec![0, 1]);
        // Alone, a batch starts into every free slot up to its own cap.
        assert_eq!(starts(8, &[d(1, 3, 10, 6)]), vec![3]);
    }

    #[test]
    fn finished_or_empty_batches_get_nothing() {
        let s = fair_shares(4, &[d(1, 0, 0, 10), d(1, 0, 10, 10)]);
        assert_eq!(s, vec![0, 4]);
        assert!(fair_shares(4, &[]).is_empty());
    }

    #[test]
    fn shares_never_exceed_the_slots_nor_what_each_wants() {
        // A small deterministic sweep over many shapes.
        let mut seed = 7u64;
        let mut next = |m: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        for _ in 0..2000 {
            let slots = next(40) as usize;
            let n = next(6) as usize;
            let demands: Vec<Demand> = (0..n)
                .map(|_| {
                    d(
                        next(5) as u32,
                        next(10) as usize,
                        next(30) as usize,
                        1 + next(20) as usize,
                    )
                })
                .collect();
            let s = fair_shares(slots, &demands);
            let total: usize = s.iter().sum();
            let wanted: usize = demands.iter().map(Demand::wants).sum();
            assert!(total <= slots, "{demands:?} {s:?}");
            // Work-conserving: slots stay idle only when nobody wants them.
            assert_eq!(total, slots.min(wanted), "{slots} {demands:?} {s:?}");
            for (share, demand) in s.iter().zip(&demands) {
                assert!(*share <= demand.wants(), "{demands:?} {s:?}");
            }
            // Starting never takes the runs under way over the slots (unless they already
            // were) nor a batch over its share.
            let st = starts(slots, &demands);
            let running: usize = demands.iter().map(|d| d.running).sum();
            let started: usize = st.iter().sum();
            assert!(
                started == 0 || running + started <= slots,
                "{demands:?} {st:?}"
            );
            for i in 0..n {
                assert!(
                    st[i] == 0 || demands[i].running + st[i] <= s[i],
                    "{demands:?} {st:?}"
                );
            }
        }
    }
}
