//! The sequences' randomness: a seeded splitmix64 (as the fault suite's), the seeds and
//! the number of sequences from the environment. Randomness decides only which steps a
//! sequence takes and how long it lets one run before the next; every outcome is still
//! waited for on an event with a deadline.

/// splitmix64 (Steele, Lea, Flood 2014).
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `lo..hi` (`lo` if the range is empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.next() % (hi - lo)
        }
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.range(0, items.len() as u64) as usize]
    }

    /// An index drawn by weight.
    pub fn weighted(&mut self, weights: &[u64]) -> usize {
        let total: u64 = weights.iter().sum();
        let mut x = self.range(0, total);
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return i;
            }
            x -= w;
        }
        weights.len() - 1
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let s = std::env::var(name).ok()?;
    let s = s.trim();
    let parsed = match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("{name}={s}: {e}")))
}

/// `SUP_COMBO_SEED` (decimal or 0x-hex): the seed of the one sequence to replay.
pub fn replay_seed() -> Option<u64> {
    env_u64("SUP_COMBO_SEED")
}

/// `SUP_COMBO_RUNS`, or `default`.
pub fn runs(default: usize) -> usize {
    env_u64("SUP_COMBO_RUNS").map_or(default, |n| n as usize)
}

/// `SUP_COMBO_THREADS` (sequences run at once, each in its own sandbox), or `default`.
pub fn threads(default: usize) -> usize {
    env_u64("SUP_COMBO_THREADS").map_or(default, |n| (n as usize).max(1))
}

/// A master seed drawn from the clock and the pid; sequence `i` of a run has the seed
/// `sequence_seed(master, i)`, printed with it.
pub fn master_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64;
    Rng(t ^ (std::process::id() as u64) << 32).next()
}

pub fn sequence_seed(master: u64, i: usize) -> u64 {
    Rng(master ^ (i as u64).wrapping_mul(0xa076_1d64_78bd_642f)).next()
}
