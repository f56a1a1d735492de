//! The suite's randomness: a seeded splitmix64, the seed and the number of kills from the
//! environment. Randomness decides only *what* happens and *when a fault is injected*;
//! every outcome is still waited for on an event with a deadline.

use std::time::Duration;

/// The kills the whole suite makes by default (each test takes its share).
pub const DEFAULT_KILLS: usize = 400;

/// splitmix64 (Steele, Lea, Flood 2014): tiny, and good enough to pick delays and actions.
pub struct Rng(u64);

impl Rng {
    /// The stream of one scenario: the suite's seed mixed with the scenario's name, so a
    /// test draws the same numbers whether it runs alone or with the others.
    pub fn for_scenario(seed: u64, scenario: &str) -> Rng {
        let name = scenario.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        Rng(seed ^ name)
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

    /// A delay of `lo..hi` milliseconds: the moment a fault is injected.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.range(0, items.len() as u64) as usize]
    }
}

/// `SUP_FAULT_SEED` (decimal or 0x-hex), or one drawn from the clock and the pid.
pub fn seed() -> u64 {
    match std::env::var("SUP_FAULT_SEED") {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("SUP_FAULT_SEED={s}: {e}"))
        }
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970")
                .as_nanos() as u64;
            Rng(t ^ (std::process::id() as u64) << 32).next()
        }
    }
}

/// This scenario's number of kills: its `share` of `DEFAULT_KILLS`, scaled by
/// `SUP_FAULT_KILLS` (the suite's total), at least one.
pub fn kills(share: usize) -> usize {
    let total = match std::env::var("SUP_FAULT_KILLS") {
        Ok(s) => s
            .trim()
            .parse::<usize>()
            .unwrap_or_else(|e| panic!("SUP_FAULT_KILLS={s}: {e}")),
        Err(_) => DEFAULT_KILLS,
    };
    (share * total / DEFAULT_KILLS).max(1)
}
