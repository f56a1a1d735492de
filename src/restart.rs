//! The restart policy: whether and when a service that ended starts again, and when a
//! run of restarts is a crash loop. Pure: a bounded record of recent restarts, the
//! policy, and `now` in; a verdict out.

use crate::config::{Policy, RestartMode};
use crate::time::Mono;
use std::collections::VecDeque;
use std::time::Duration;

/// What the policy decided about one exit (or failed start).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Start it again after `delay`.
    Restart { delay: Duration },
    /// It ended as it should and is not to be restarted.
    Finished,
    /// It failed and the restart mode says not to try again.
    GiveUp,
    /// It was restarted `restarts` times within `within`: a crash loop.
    CrashLoop { restarts: u32, within: Duration },
}

/// The recent past of one service: its failure streak and its last restarts.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct History {
    /// Consecutive failures, reset by an uptime of `stable_after`.
    pub streak: u32,
    /// Times of the most recent automatic restarts, oldest first; never longer than
    /// `crash_loop.restarts`.
    pub recent: VecDeque<Mono>,
}

impl History {
    /// Forgets everything: after a cooldown, or an operator's `start`.
    pub fn reset(&mut self) {
        self.streak = 0;
        self.recent.clear();
    }

    /// Decides about an exit at `now` after `uptime`, `failed` or not, and records the
    /// restart it decides on.
    pub fn on_exit(&mut self, p: &Policy, failed: bool, uptime: Duration, now: Mono) -> Verdict {
        if uptime >= p.stable_after {
            self.streak = 0;
        }
        let again = match p.restart {
            RestartMode::Always => true,
            RestartMode::OnFailure => failed,
            RestartMode::Never => false,
        };
        if !again {
            return if failed {
                Verdict::GiveUp
            } else {
                Verdict::Finished
            };
        }
        self.recent.retain(|t| now.since(*t) <= p.crash_loop.window);
        let limit = p.crash_loop.restarts as usize;
        if self.recent.len() >= limit {
            let within = self
                .recent
                .front()
                .map(|t| now.since(*t))
                .unwrap_or_default();
            return Verdict::CrashLoop {
                restarts: self.recent.len() as u32,
                within,
            };
        }
        if failed {
            self.streak = self.streak.saturating_add(1);
        }
        self.recent.push_back(now);
        while self.recent.len() > limit {
            self.recent.pop_front();
        }
        Verdict::Restart {
            delay: delay(p, self.streak),
        }
    }
}

/// `restart_delay`, doubled for each failure of the streak after the first, capped.
fn delay(p: &Policy, streak: u32) -> Duration {
    let doublings = streak.saturating_sub(1).min(32);
    p.restart_delay
        .saturating_mul(1u32 << doublings.min(31))
        .min(p.restart_delay_max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CrashLoop;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn policy() -> Policy {
        Policy {
            restart_delay: ms(100),
            restart_delay_max: ms(1000),
            stable_after: ms(10_000),
            crash_loop: CrashLoop {
                restarts: 5,
                window: ms(60_000),
            },
            ..Policy::default()
        }
    }

    /// (restart mode, failed) → verdict, for a first exit.
    #[test]
    fn restart_modes() {
        use RestartMode::*;
        let restart = Verdict::Restart { delay: ms(100) };
        let table = [
            (Always, true, restart.clone()),
            (Always, false, restart.clone()),
            (OnFailure, true, restart.clone()),
            (OnFailure, false, Verdict::Finished),
            (Never, true, Verdict::GiveUp),
            (Never, false, Verdict::Finished),
        ];
        for (mode, failed, want) in table {
            let p = Policy {
                restart: mode,
                ..policy()
            };
            let got = History::default().on_exit(&p, failed, ms(5), Mono(0));
            assert_eq!(got, want, "{mode:?} failed={failed}");
        }
    }

    #[test]
    fn delays_double_per_failure_up_to_the_max() {
        let p = Policy {
            crash_loop: CrashLoop {
                restarts: 100,
                window: ms(1),
            },
            ..policy()
        };
        let mut h = History::default();
        let delays: Vec<u64> = (0..7)
            .map(
                |i| match h.on_exit(&p, true, ms(1), Mono(i * 10_000_000_000)) {
                    Verdict::Restart { delay } => delay.as_millis() as u64,
                    other => panic!("unexpected {other:?}"),
                },
            )
            .collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000, 1000]);
    }

    #[test]
    fn a_success_does_not_grow_the_delay_and_stable_uptime_resets_the_streak() {
        let p = policy();
        let mut h = History::default();
        let at = |s: u64| Mono(s * 1_000_000_000);
        assert_eq!(
            h.on_exit(&p, true, ms(1), at(0)),
            Verdict::Restart { delay: ms(100) }
        );
        assert_eq!(
            h.on_exit(&p, true, ms(1), at(1)),
            Verdict::Restart { delay: ms(200) }
        );
        assert_eq!(
            h.on_exit(&p, false, ms(1), at(2)),
            Verdict::Restart { delay: ms(200) }
        );
        // Up for stable_after: the streak starts again from the first delay.
        assert_eq!(
            h.on_exit(&p, true, ms(10_000), at(20)),
            Verdict::Restart { delay: ms(100) }
        );
        assert_eq!(h.streak, 1);
    }

    #[test]
    fn crash_loop_after_n_restarts_within_the_window() {
        let p = policy();
        let mut h = History::default();
        for i in 0..5 {
            let v = h.on_exit(&p, true, ms(1), Mono(i * 1_000_000_000));
            assert!(matches!(v, Verdict::Restart { .. }), "restart {i}: {v:?}");
        }
        let v = h.on_exit(&p, true, ms(1), Mono(5_000_000_000));
        assert_eq!(
            v,
            Verdict::CrashLoop {
                restarts: 5,
                within: ms(5000)
            }
        );
    }

    #[test]
    fn restarts_outside_the_window_do_not_count() {
        let p = policy();
        let mut h = History::default();
        // One restart every 20 s: never 5 within a minute.
        for i in 0..20 {
            let v = h.on_exit(&p, true, ms(1), Mono(i * 20_000_000_000));
            assert!(matches!(v, Verdict::Restart { .. }), "restart {i}: {v:?}");
        }
        assert!(h.recent.len() <= 5);
    }

    #[test]
    fn reset_forgets_the_loop() {
        let p = policy();
        let mut h = History::default();
        for i in 0..5 {
            h.on_exit(&p, true, ms(1), Mono(i));
        }
        h.reset();
        assert_eq!(
            h.on_exit(&p, true, ms(1), Mono(10)),
            Verdict::Restart { delay: ms(100) }
        );
    }

    #[test]
    fn zero_delay_stays_zero() {
        let p = Policy {
            restart_delay: Duration::ZERO,
            ..policy()
        };
        let mut h = History::default();
        for i in 0..4 {
            assert_eq!(
                h.on_exit(&p, true, ms(1), Mono(i)),
                Verdict::Restart {
                    delay: Duration::ZERO
                }
            );
        }
    }
}
