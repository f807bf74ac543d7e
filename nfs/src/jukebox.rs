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
//! ([`keep_holding`]), from the copy's progress so far ([`CopyPace`]) and the
//! retries this READ has had. Each retry plans again with a better estimate.
//!
//! A hold only ever delays the retries after it: one too long cannot be made up
//! for. After a first READ held `h`, Apple's retries held up to 4 s each can cover
//! a copy ending `h` + 4-8 s, 12-20 s, 28-40 s, 58-74 s or 88-108 s in (and, from
//! about 2 minutes on, at any time); Linux's 5 s retries leave no gap past 9 s.
//! Held its whole 4 s while nothing is known, the first READ puts Apple's third
//! retry 32 s in and the fourth 62 s in at the earliest: 2 s past a 60 s copy.
//! So a first READ is held on, while the copy's rate is not yet trusted, only
//! for a copy that may end within its hold or its first retry's reach: from
//! [`EARLY_AFTER`] into the copy, one that has read nothing and cannot end within
//! that reach has its first READ answered at once (`h` = 2 s: then 30-42 s and
//! 60-76 s are covered), and one whose bytes so far put its end past that reach
//! even 30% sooner (`ROOM`) has its first READ planned on them.
//!
//! A rate is taken between the instants the copy was seen moving, and the time left
//! counted from the last of them ([`CopyPace`]): a source that answers in steps
//! (parallel reads landing together) is then seen at its pace between steps too,
//! where a rate averaged up to now is low by up to a step, and the plan, aimed
//! later each look, holds the retry that should have gone.

use std::time::{Duration, Instant};

use stagefs_source::copy::{COPY_STREAMS, NETWORK_CHUNK};

/// The longest a READ is held: under the 5 s after which the macOS client marks the
/// server "not responding", with a second's room for the read and the network.
pub const MAX_HOLD: Duration = Duration::from_secs(4);

/// How long after a JUKEBOX a client may keep attributes past their time: Apple's
/// client on a laptop returns cached attributes without looking at their age while
/// any call of the mount is being retried after a JUKEBOX (`../shared/
/// nfs-symlink-caching.md`); it retries at most 30 s later, the retry is answered
/// within [`MAX_HOLD`] (or JUKEBOX again, which starts this anew), and the client's
/// attributes then expire within a second.
pub const LINKS_SETTLE: Duration = Duration::from_secs(40);

/// A call of the mount was answered JUKEBOX: no copy an NFS link named is removed
/// until the clients can have settled ([`LINKS_SETTLE`]).
pub fn answered(policy: &stagefs_policy::Policy) {
    policy.links_unsettled_until(Instant::now() + LINKS_SETTLE);
}

/// How long a copy must have been seen moving before its rate is trusted
/// ([`CopyEnd::Expected`]). An early rate of a source that answers in steps, or
/// shares a busy machine, was seen 40% off (nfs/tests/protocol.rs), enough to plan
/// the retries past the copy's end.
pub const RATE_AFTER: Duration = Duration::from_secs(2);

/// How long after a copy starts its bytes so far are weighed at all, before its rate
/// is trusted ([`CopyEnd::Rough`], [`CopyEnd::Unread`]).
pub const EARLY_AFTER: Duration = Duration::from_secs(2);

/// The most bytes a copy's first reads bring in at once: [`COPY_STREAMS`] reads of
/// a network source's chunk land together. A copy that has read nothing for `t`
/// reads each such round in more than `t`.
const FIRST_READS: u64 = (COPY_STREAMS * NETWORK_CHUNK) as u64;

/// How much sooner than estimated a copy is taken to be able to end, when a READ
/// weighs whether to be held on: estimates from a copy's first bytes have been
/// seen 20-40% off, and near its end its last reads land together.
const ROOM: f64 = 0.7;

/// What a READ's hold goes by: when the copy it waits for is expected to end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CopyEnd {
    /// Nothing yet ([`EARLY_AFTER`] has not passed, or no copy is under way).
    Unknown,
    /// The copy has read nothing since it started: it ends `at_least` from now, if
    /// it reads the rest as slowly as its first round (`FIRST_READS`).
    Unread {
        /// The soonest it can end from now.
        at_least: Duration,
    },
    /// From the bytes read since the copy started, whatever it waited for before
    /// its first: `left` from now, rough.
    Rough(Duration),
    /// From the rate since the copy was first seen moving, for [`RATE_AFTER`] or
    /// more: `left` from now.
    Expected(Duration),
}

/// How a copy has moved, from looks at its progress: what [`CopyEnd`] a READ
/// waiting for it goes by. A source may answer in steps (parallel reads landing
/// together, seen over a look or two), so its moves are taken in steps: those seen
/// within `STEP_SPAN` of a step's first belong to it. The rate counts the bytes
/// of the whole steps between the first step's start and the latest one's, over
/// the time between them, and the time left is counted from the last move: exact at
/// a step and between steps alike, where a rate averaged up to now is low by up to
/// a step, and one from a step's first landing on counts the rest of it as read in
/// no time.
#[derive(Debug, Clone, Copy)]
pub struct CopyPace {
    /// When the copy was first looked at, and at how many bytes read.
    started: (Instant, u64),
    /// When the first step began, and the bytes read before it.
    first_step: Option<(Instant, u64)>,
    /// When the latest step began, and the bytes read before it.
    step: Option<(Instant, u64)>,
    /// When it was last seen moving, and at how many bytes read.
    last: Option<(Instant, u64)>,
    /// Bytes to copy.
    total: u64,
}

/// How long after a step's first move a move still belongs to it: the reads of a
/// step land within a look or two of each other, even on a busy machine.
const STEP_SPAN: Duration = Duration::from_millis(300);

impl CopyPace {
    /// A copy first looked at `now`, having read `read` of `total` bytes.
    pub fn new(now: Instant, read: u64, total: u64) -> CopyPace {
        CopyPace {
            started: (now, read),
            first_step: None,
            step: None,
            last: None,
            total,
        }
    }

    /// Bytes read at the last look that found the copy moving (or the first look).
    pub fn seen(&self) -> u64 {
        self.last.map_or(self.started.1, |(_, read)| read)
    }

    /// Notes a look at `now` that found `read` of `total` bytes read.
    pub fn look(&mut self, now: Instant, read: u64, total: u64) {
        self.total = total;
        let before = self.seen();
        if read <= before {
            return;
        }
        let in_step = self
            .step
            .is_some_and(|(at, _)| now.saturating_duration_since(at) <= STEP_SPAN);
        if !in_step {
            self.step = Some((now, before));
            self.first_step.get_or_insert((now, before));
        }
        self.last = Some((now, read));
    }

    /// When the copy is expected to end, as seen at `now`.
    pub fn end(&self, now: Instant) -> CopyEnd {
        let left = |(at, read): (Instant, u64), rate: f64| {
            let to_read = self.total.saturating_sub(read) as f64;
            let end = at + Duration::from_secs_f64(to_read / rate.max(1.0));
            end.saturating_duration_since(now)
        };
        let rate = |(at, read): (Instant, u64), (from_at, from): (Instant, u64)| {
            let span = at.saturating_duration_since(from_at).as_secs_f64();
            read.saturating_sub(from) as f64 / span.max(1e-3)
        };
        if let (Some(first), Some(step), Some(last)) = (self.first_step, self.step, self.last)
            && now.saturating_duration_since(first.0) >= RATE_AFTER
            && step.1 > first.1
        {
            return CopyEnd::Expected(left(last, rate(step, first)));
        }
        let since = now.saturating_duration_since(self.started.0);
        if since < EARLY_AFTER {
            return CopyEnd::Unknown;
        }
        match self.last {
            Some(last) => CopyEnd::Rough(left(last, rate(last, self.started))),
            None => {
                let rounds = self.total.saturating_sub(self.started.1) as f64 / FIRST_READS as f64;
                CopyEnd::Unread {
                    at_least: since.mul_f64(rounds).saturating_sub(since),
                }
            }
        }
    }
}

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
/// for is expected to end as `end` says, this READ has been answered JUKEBOX `tries`
/// times before, and its client backs off as one of `clients` does (a plan must
/// then suit each: it goes by the worst outcome).
///
/// A copy expected to end within the hold is waited for. Otherwise the hold is the
/// one whose later retries reach the copy's end soonest after it ends (best: a
/// retry held across it), and of those the one with the most room around the end
/// on both sides, so that an estimate a little off still lands; on a tie, the
/// shortest. An unknown end is waited for until an estimate comes or the hold ends;
/// so is a rough one that may be a good deal sooner, when the first READ's retry
/// could still be held across it (`first_reach`). A first READ whose copy has
/// read nothing and cannot end within that reach is answered at once.
pub fn keep_holding(held: Duration, end: CopyEnd, tries: u32, clients: &[Backoff]) -> bool {
    if held >= MAX_HOLD {
        return false;
    }
    match end {
        CopyEnd::Unknown => true,
        CopyEnd::Unread { at_least } => tries > 0 || held + at_least <= first_reach(clients),
        CopyEnd::Rough(left) => {
            let reach = if tries == 0 {
                first_reach(clients)
            } else {
                MAX_HOLD
            };
            let aim = Aim {
                left,
                tries,
                later: ROUGH_LATER,
            };
            (held + left).mul_f64(ROOM) <= reach || aim.holds(held, clients)
        }
        CopyEnd::Expected(left) => {
            let aim = Aim {
                left,
                tries,
                later: EXPECTED_LATER,
            };
            aim.holds(held, clients)
        }
    }
}

/// How long after a first READ arrives its first retry can be held to: the whole
/// hold, the longest first wait of `clients`, and the retry's whole hold.
fn first_reach(clients: &[Backoff]) -> Duration {
    let wait = clients.iter().map(|client| client.delay(0)).max();
    MAX_HOLD + wait.unwrap_or_default() + MAX_HOLD
}

/// How much more room after a copy's expected end counts than room before it, when
/// a hold is chosen: a later retry can be held longer for an end that comes later,
/// but no hold can bring a retry sooner, so a hold spent on an end expected late is
/// lost when the copy speeds up. For a rate from the copy's first bytes, rough,
/// room before the end is all that counts: the shortest hold that reaches the end.
const EXPECTED_LATER: u32 = 2;
/// The same for an end estimated from a copy's bytes since it started.
const ROUGH_LATER: u32 = 1000;

/// A plan for a READ answered JUKEBOX `tries` times before, when its copy is
/// expected to end `left` from now: room after the end counts `later` times as
/// much as room before it.
#[derive(Debug, Clone, Copy)]
struct Aim {
    left: Duration,
    tries: u32,
    later: u32,
}

impl Aim {
    /// Whether a READ held `held` so far holds on: while the copy is expected to
    /// end within the hold, and from a READ's third try on (the copy nearly done,
    /// the next retry 5-30 s away) while it may, 30% sooner ([`ROOM`]). Near a
    /// copy's end its last reads land in parallel, sooner than its rate says.
    fn holds(self, held: Duration, clients: &[Backoff]) -> bool {
        let room = if self.tries >= 2 { ROOM } else { 1.0 };
        held + self.left.mul_f64(room) <= MAX_HOLD || best_hold(held, self, clients) > held
    }
}

/// The hold in `[held, MAX_HOLD]` (to [`STEP`]) that [`keep_holding`] aims for, when
/// the copy is expected to end `aim.left` after `held`: judged by its worst outcome
/// over the clients in `clients`.
fn best_hold(held: Duration, aim: Aim, clients: &[Backoff]) -> Duration {
    let end = held + aim.left;
    let worst = |hold| {
        clients
            .iter()
            .map(|&client| outlook(hold, end, aim, client))
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
fn outlook(hold: Duration, end: Duration, aim: Aim, backoff: Backoff) -> Outlook {
    let mut earliest = hold;
    for m in 0..HORIZON {
        earliest += backoff.delay(aim.tries + m);
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
                margin: (end - earliest).min((latest_end - end) * aim.later),
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
                let end = match now >= known_after {
                    true => CopyEnd::Expected(S(copy - now)),
                    false => CopyEnd::Unknown,
                };
                let clients = if tries == 0 { assumed } else { &[backoff] };
                if !keep_holding(S(now - arrived), end, tries, clients) {
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
        let expected = |left| CopyEnd::Expected(S(left));
        assert!(keep_holding(S(1.0), expected(2.9), 0, Backoff::UNKNOWN));
        assert!(!keep_holding(MAX_HOLD, expected(0.1), 0, Backoff::UNKNOWN));
        assert!(
            keep_holding(S(0.5), CopyEnd::Unknown, 3, &[Backoff::Apple]),
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
        let end = CopyEnd::Expected(S(10.54));
        assert!(keep_holding(S(1.42), end, 0, Backoff::UNKNOWN));
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

    /// A copy of a 64 MiB file whose bytes land 4 MiB at a time (as the benchmark's
    /// source answers: four 1 MiB reads at once, seen in two halves 50 ms apart),
    /// the last at `end` seconds, its first `early` steps `skew` times as far apart
    /// as the rest: at 1.3 the rate from those is about 30% slow, at 0.7 about 30%
    /// fast. The first step lands at a 16th of the copy, so a rate is known from
    /// 0.2 s into a 3 s copy, from 3.75 s into a 60 s one.
    struct Source {
        /// When each half step lands, in ms after the first READ.
        landings: Vec<u64>,
    }

    const STEP_BYTES: u64 = 4 << 20;

    impl Source {
        fn even(end: f64) -> Source {
            Source::stepped(end, 1.0, 0)
        }

        fn stepped(end: f64, skew: f64, early: u32) -> Source {
            let (early, late) = (f64::from(early), f64::from(16 - early));
            let gap = end / (early * skew + late);
            let landings = (1..=16)
                .flat_map(|k| {
                    let k = f64::from(k);
                    let at = gap * (k.min(early) * skew + (k - early).max(0.0));
                    let at = (at * 1000.0).round() as u64;
                    [at.saturating_sub(50), at]
                })
                .collect();
            Source { landings }
        }

        fn read(&self, ms: u64) -> u64 {
            let landed = self.landings.iter().filter(|&&at| at <= ms).count() as u64;
            landed * STEP_BYTES / 2
        }

        fn end(&self) -> u64 {
            self.landings[31]
        }
    }

    /// How a client fared: how long after the copy's end it was served, how many
    /// JUKEBOXes it had, and its longest call, in seconds.
    #[derive(Debug)]
    struct Served {
        late: f64,
        jukeboxes: u32,
        longest: f64,
    }

    /// The server as reads.rs runs it, against `source`: the copy looked at every
    /// 50 ms ([`CopyPace`]), each held READ deciding every 100 ms from its arrival;
    /// a client that backs off as `client` does, planned for as `assumed` until its
    /// first retry shows it.
    fn serve(source: &Source, client: Backoff, assumed: &[Backoff]) -> Served {
        let total = 16 * STEP_BYTES;
        let base = Instant::now();
        let at = |ms: u64| base + Duration::from_millis(ms);
        let mut pace = CopyPace::new(at(0), 0, total);
        let (mut arrived, mut next, mut holding) = (0u64, 0u64, false);
        let (mut tries, mut longest) = (0u32, 0u64);
        let mut ms = 0u64;
        loop {
            if !holding && ms >= next {
                (holding, arrived) = (true, ms);
            }
            if holding && source.end() <= ms {
                let served = arrived.max(source.end());
                return Served {
                    late: (served - source.end()) as f64 / 1000.0,
                    jukeboxes: tries,
                    longest: longest.max(served - arrived) as f64 / 1000.0,
                };
            }
            pace.look(at(ms), source.read(ms), total);
            let held = ms - arrived;
            if holding && held.is_multiple_of(100) {
                let clients = if tries == 0 { assumed } else { &[client] };
                let end = pace.end(at(ms));
                if !keep_holding(Duration::from_millis(held), end, tries, clients) {
                    longest = longest.max(held);
                    next = ms + client.delay(tries).as_millis() as u64;
                    (holding, tries) = (false, tries + 1);
                }
            }
            ms += 50;
            assert!(ms < 600_000, "never served");
        }
    }

    /// The bound and more: a macOS client is served within half a second of
    /// the end of a copy of 3 to 60 s from a source that answers in steps (at 60 s
    /// one each 3.75 s, so nothing is read within 2 s), no call held past
    /// MAX_HOLD. The planner before held a first READ its whole 4 s while nothing
    /// was known, which put Apple's third retry 32 s in and the fourth 62 s in at
    /// the earliest, and took a rate between steps as slower than it is: +1.9 s
    /// after the 30 s copy, +3.8 s after the 60 s one.
    #[test]
    fn an_apple_client_is_served_within_half_a_second_of_stepped_copies_of_3_to_60_s() {
        for copy in [3.0, 10.0, 20.0, 30.0, 40.0, 60.0] {
            for assumed in [&[Backoff::Apple][..], Backoff::UNKNOWN] {
                let served = serve(&Source::even(copy), Backoff::Apple, assumed);
                assert!(
                    served.late <= 0.5 && served.longest <= 4.0,
                    "{copy} s copy assuming {assumed:?}: {served:?}"
                );
            }
        }
    }

    /// A copy ending where no retry of Apple's can be held (here 42-60 s) is served
    /// at the fourth retry's earliest: 60 s in, after a first READ held 2 s (the
    /// planner before: 62 s, after one held 4 s).
    #[test]
    fn an_apple_client_is_served_at_the_soonest_retry_past_a_45_s_copy() {
        let served = serve(&Source::even(45.0), Backoff::Apple, Backoff::UNKNOWN);
        assert!(
            served.late <= 60.5 - 45.0 && served.jukeboxes == 4,
            "served {served:?} after a 45 s copy"
        );
    }

    /// The copies of the issue from a source whose first bytes come 30% slower or
    /// faster than the rest: the first estimates are that far off, and no plan
    /// made on them is past mending. The planner before answered the 10 s copy
    /// 4.6-4.9 s late, the 60 s one 2.0-5.6 s.
    #[test]
    fn copies_whose_first_bytes_mislead_by_30_percent_are_served_within_2_s() {
        for copy in [3.0, 10.0, 30.0, 60.0] {
            for skew in [0.7, 1.3] {
                let source = Source::stepped(copy, skew, 1);
                let served = serve(&source, Backoff::Apple, Backoff::UNKNOWN);
                assert!(
                    served.late <= 2.0 && served.longest <= 4.0,
                    "{copy} s copy, skew {skew}: {served:?}"
                );
            }
        }
    }

    /// Linux's client, whose 5 s retries leave no end out of reach: within a second
    /// even when the first quarter of the copy runs 30% off the rest (the planner
    /// before: up to +1.7 s at 45 s, +1.6 s at 60 s).
    #[test]
    fn a_linux_client_is_served_within_a_second_of_stepped_copies() {
        for copy in [3.0, 10.0, 30.0, 45.0, 60.0] {
            for skew in [0.7, 1.0, 1.3] {
                let source = Source::stepped(copy, skew, 4);
                let served = serve(&source, Backoff::LINUX, Backoff::UNKNOWN);
                assert!(
                    served.late <= 1.0 && served.longest <= 4.0,
                    "{copy} s copy, skew {skew}: {served:?}"
                );
            }
        }
    }

    /// A rate is taken between the instants the copy moved, not up to now: between
    /// a source's steps the time left does not grow.
    #[test]
    fn a_stepped_copy_is_expected_at_its_end_between_steps() {
        let base = Instant::now();
        let source = Source::even(60.0);
        let mut pace = CopyPace::new(base, 0, 16 * STEP_BYTES);
        for ms in (0..=14_000).step_by(50) {
            pace.look(
                base + Duration::from_millis(ms),
                source.read(ms),
                16 * STEP_BYTES,
            );
        }
        // The last step was at 11.25 s, the next comes at 15 s.
        match pace.end(base + S(14.0)) {
            CopyEnd::Expected(left) => assert!((left.as_secs_f64() - 46.0).abs() < 0.1, "{left:?}"),
            other => panic!("{other:?}"),
        }
    }

    /// Before [`EARLY_AFTER`] nothing is known; after it a copy that has read
    /// nothing takes its wait so far for each round of reads.
    #[test]
    fn a_copy_that_read_nothing_is_known_to_take_a_round_per_wait() {
        let base = Instant::now();
        let mut pace = CopyPace::new(base, 0, 64 << 20);
        pace.look(base + S(1.9), 0, 64 << 20);
        assert_eq!(pace.end(base + S(1.9)), CopyEnd::Unknown);
        // 64 MiB is 8 rounds of four 2 MiB reads, each more than 2 s.
        let end = pace.end(base + S(2.0));
        assert_eq!(end, CopyEnd::Unread { at_least: S(14.0) });
        assert!(!keep_holding(S(2.0), end, 0, Backoff::UNKNOWN));
        // A 16 MiB file may still end within the first retry's reach: held on.
        let small = CopyPace::new(base, 0, 16 << 20);
        assert!(keep_holding(
            S(2.0),
            small.end(base + S(2.0)),
            0,
            Backoff::UNKNOWN
        ));
    }

    /// A rough end, from a copy's first bytes, is no reason to let a first READ go
    /// while the copy may still end within its first retry's reach, 30% sooner.
    #[test]
    fn a_first_read_holds_on_while_a_rough_end_may_be_within_reach() {
        assert!(keep_holding(
            S(2.0),
            CopyEnd::Rough(S(15.0)),
            0,
            Backoff::UNKNOWN
        ));
        assert!(!keep_holding(
            S(2.0),
            CopyEnd::Rough(S(28.0)),
            0,
            Backoff::UNKNOWN
        ));
    }

    /// Seen with Linux's client on a 30 s copy (readbench, a busy machine): its
    /// fifth READ, held 2.63 s, expected the copy 1.41 s later, just past its hold,
    /// and was answered JUKEBOX; the copy ended 30 ms later and the retry came 5 s
    /// after. Near the end a READ holds on while the copy may end within its hold.
    #[test]
    fn a_retry_holds_on_while_the_copy_may_end_within_its_hold() {
        let end = CopyEnd::Expected(S(1.41));
        assert!(keep_holding(S(2.63), end, 4, &[Backoff::LINUX]));
        assert!(keep_holding(S(2.63), end, 3, &[Backoff::Apple]));
        assert!(!keep_holding(
            S(2.63),
            CopyEnd::Expected(S(2.5)),
            4,
            &[Backoff::LINUX]
        ));
    }
}
