//! When a READ of a file still staging stops waiting and answers `NFS3ERR_JUKEBOX`.
//!
//! NFSv3 has no OPEN, so the first READ of a cold file starts its copy and cannot be
//! answered until the copy is whole. A READ is never held past [`MAX_HOLD`]: the
//! macOS client marks the server "not responding" once a call waits 5 s. After a
//! JUKEBOX the client sleeps and sends the same READ again (with a new XID): Apple's
//! client 4 s, then 8, 16 and 30 s from then on; Linux's 5 s each time
//! ([`Backoff`]). A copy that ends while the client sleeps is served only at the
//! next retry, so with Apple's doubling a fixed hold answers up to ~30 s after the
//! copy is done.
//!
//! The hold is the one thing the server chooses, and it moves every later retry: a
//! READ answered JUKEBOX after holding `h` comes back at `h + delay`. So each READ
//! is held for the time that lands a later retry's hold on the copy's expected end
//! ([`keep_holding`]), from the copy's progress so far and the retries this READ has
//! had. Each retry plans again with a better estimate. With Apple's schedule, holds
//! of up to 4 s can cover a copy ending at any time in 0-24 s, 28-44 s, 58-78 s,
//! 88-112 s and, from about 2 minutes on, at any time; Linux's 5 s covers all from
//! 9 s on.

use std::time::Duration;

/// The longest a READ is held: under the 5 s after which the macOS client marks the
/// server "not responding", with a second's room for the read and the network.
pub const MAX_HOLD: Duration = Duration::from_secs(4);

/// How a client waits after a JUKEBOX before sending the call again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Backoff {
    /// Apple's client: 4 s, doubling to a 30 s cap (nfs_socket.c's `r_delay`).
    Apple,
    /// The same wait each time, as Linux's client (`NFS_JUKEBOX_RETRY_TIME`, 5 s).
    Fixed(Duration),
}

impl Backoff {
    /// Linux's client.
    pub const LINUX: Backoff = Backoff::Fixed(Duration::from_secs(5));

    /// The clients to plan for before a retry has shown which one it is: Apple's
    /// and Linux's, the two a mount of stagefs has.
    pub const UNKNOWN: &'static [Backoff] = &[Backoff::Apple, Backoff::LINUX];

    /// The client whose first wait after a JUKEBOX was `gap`: Apple's waits 4 s,
    /// anything else is taken to wait the same each time.
    pub fn from_first_wait(gap: Duration) -> Backoff {
        if gap < Duration::from_millis(4500) {
            Backoff::Apple
        } else {
            Backoff::Fixed(gap)
        }
    }

    /// How long the client sleeps after the call's JUKEBOX number `tries + 1`.
    pub fn delay(self, tries: u32) -> Duration {
        match self {
            Backoff::Apple => Duration::from_secs((4u64 << tries.min(3)).min(30)),
            Backoff::Fixed(delay) => delay,
        }
    }
}

/// How many retries ahead a plan looks: past them every copy end is covered.
const HORIZON: u32 = 40;
/// The resolution of the holds a plan chooses among.
const STEP: Duration = Duration::from_millis(100);

/// Whether a READ held `held` so far should be held longer, when the copy it waits
/// for is expected to end in `copy_left` (`None`: not known yet), this READ has
/// been answered JUKEBOX `tries` times before, and its client backs off as one of
/// `clients` does (a plan must then suit each: it goes by the worst outcome).
///
/// A copy expected to end within the hold is waited for. Otherwise the hold is the
/// one whose later retries reach the copy's end soonest after it ends (best: a
/// retry held across it), and of those the one with the most room around the end
/// on both sides, so that an estimate a little off still lands; on a tie, the
/// shortest. An unknown end is waited for until an estimate comes or the hold ends.
pub fn keep_holding(
    held: Duration,
    copy_left: Option<Duration>,
    tries: u32,
    clients: &[Backoff],
) -> bool {
    if held >= MAX_HOLD {
        return false;
    }
    let Some(left) = copy_left else {
        return true;
    };
    if held + left <= MAX_HOLD {
        return true;
    }
    best_hold(held, left, tries, clients) > held
}

/// The hold in `[held, MAX_HOLD]` (to [`STEP`]) that [`keep_holding`] aims for, when
/// the copy is expected to end `left` after `held`: judged by its worst outcome
/// over the clients in `clients`.
fn best_hold(held: Duration, left: Duration, tries: u32, clients: &[Backoff]) -> Duration {
    let end = held + left;
    let worst = |hold| {
        clients
            .iter()
            .map(|&client| outlook(hold, end, tries, client))
            .reduce(Outlook::worse_of)
            .unwrap_or(Outlook::ANY)
    };
    let mut best = (held, worst(held));
    let steps = std::iter::successors(Some(held + STEP), |hold| Some(*hold + STEP));
    // The longest hold is always a candidate, wherever the steps from `held` end.
    let candidates = steps.take_while(|hold| *hold < MAX_HOLD).chain([MAX_HOLD]);
    for hold in candidates {
        let candidate = worst(hold);
        if candidate.better_than(&best.1) {
            best = (hold, candidate);
        }
    }
    best.0
}

/// How a hold turns out for a copy ending at `end`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Outlook {
    /// How long after the copy's end the first retry that can be served arrives
    /// (zero when a retry is held across the end).
    late: Duration,
    /// Room on either side of the end within the retry that covers it.
    margin: Duration,
}

impl Outlook {
    /// Where no hold is better than another.
    const ANY: Outlook = Outlook {
        late: Duration::ZERO,
        margin: Duration::ZERO,
    };

    fn worse_of(self, other: Outlook) -> Outlook {
        Outlook {
            late: self.late.max(other.late),
            margin: self.margin.min(other.margin),
        }
    }

    fn better_than(&self, other: &Outlook) -> bool {
        self.late < other.late || (self.late == other.late && self.margin > other.margin)
    }
}

/// Where `end` falls among the retries after a hold of `hold`: retry `m` arrives at
/// the earliest at `hold` plus the `m` next delays, and as late as `(m - 1)` full
/// holds after that, and each is held up to [`MAX_HOLD`].
fn outlook(hold: Duration, end: Duration, tries: u32, backoff: Backoff) -> Outlook {
    let mut earliest = hold;
    for m in 0..HORIZON {
        earliest += backoff.delay(tries + m);
        let latest_end = earliest + MAX_HOLD * (m + 1);
        if end < earliest {
            return Outlook {
                late: earliest - end,
                margin: Duration::ZERO,
            };
        }
        if end <= latest_end {
            return Outlook {
                late: Duration::ZERO,
                margin: (end - earliest).min(latest_end - end),
            };
        }
    }
    // Beyond the horizon every end is covered.
    Outlook::ANY
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(f64) -> Duration = Duration::from_secs_f64;

    /// When a client following `backoff` gets its READ answered, for a copy that
    /// ends `copy` after the first READ, with the copy's end known exactly from
    /// `known_after` on: the server's holds simulated in `STEP` ticks.
    fn first_byte(copy: f64, backoff: Backoff, assumed: &[Backoff], known_after: f64) -> f64 {
        let (mut now, mut tries) = (0.0f64, 0u32);
        loop {
            let arrived = now;
            loop {
                if now >= copy {
                    return now;
                }
                let left = (now >= known_after).then(|| S(copy - now));
                let clients = if tries == 0 { assumed } else { &[backoff] };
                if !keep_holding(S(now - arrived), left, tries, clients) {
                    break;
                }
                now += STEP.as_secs_f64();
            }
            now += backoff.delay(tries).as_secs_f64();
            tries += 1;
        }
    }

    #[test]
    fn apple_delays_double_from_4_to_a_30_second_cap() {
        let delays: Vec<u64> = (0..6).map(|t| Backoff::Apple.delay(t).as_secs()).collect();
        assert_eq!(delays, [4, 8, 16, 30, 30, 30]);
        assert_eq!(Backoff::LINUX.delay(7), S(5.0));
    }

    #[test]
    fn the_first_wait_tells_apple_from_a_fixed_schedule() {
        assert_eq!(Backoff::from_first_wait(S(4.02)), Backoff::Apple);
        assert_eq!(Backoff::from_first_wait(S(5.0)), Backoff::LINUX);
    }

    #[test]
    fn a_copy_ending_within_the_hold_is_waited_for() {
        assert!(keep_holding(S(1.0), Some(S(2.9)), 0, Backoff::UNKNOWN));
        assert!(!keep_holding(MAX_HOLD, Some(S(0.1)), 0, Backoff::UNKNOWN));
        assert!(
            keep_holding(S(0.5), None, 3, &[Backoff::Apple]),
            "unknown: hold"
        );
    }

    /// The first READ is held until the copy's rate is known (2.5 s into it here),
    /// so a retry comes 6.5 s in at the earliest: that is the 6 s copy's half second.
    #[test]
    fn an_apple_client_is_answered_within_half_a_second_of_copies_ending_at_3_to_70_s() {
        for copy in [3.0, 6.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 70.0] {
            for assumed in [&[Backoff::Apple][..], Backoff::UNKNOWN] {
                let served = first_byte(copy, Backoff::Apple, assumed, 2.5);
                assert!(
                    served - copy < 0.6,
                    "copy of {copy} s served at {served} s assuming {assumed:?}"
                );
            }
        }
    }

    #[test]
    fn the_longest_hold_is_weighed_from_any_start() {
        // Only a full 4 s hold reaches 11.96 s with Apple's first retry (at 8 s, held
        // to 12 s); the steps from 1.42 s end at 3.92 s.
        assert!(keep_holding(S(1.42), Some(S(10.54)), 0, Backoff::UNKNOWN));
    }

    #[test]
    fn ends_no_hold_can_reach_are_served_at_the_next_retry() {
        // 26 s lies between what the third retry (12-24 s) and the fourth (28-44 s)
        // can cover: the fourth arrives at its earliest, 28 s.
        let served = first_byte(26.0, Backoff::Apple, &[Backoff::Apple], 0.0);
        assert!((served - 28.0).abs() < 0.2, "served at {served}");
    }

    #[test]
    fn a_linux_client_is_answered_within_a_tick_from_9_s_on() {
        for copy in [3.0, 9.5, 12.0, 23.8, 47.5] {
            for assumed in [&[Backoff::LINUX][..], Backoff::UNKNOWN] {
                let served = first_byte(copy, Backoff::LINUX, assumed, 2.5);
                assert!(served - copy < 0.2, "copy of {copy} s served at {served} s");
            }
        }
    }
}
