//! Copies named by the text of an NFS client's cached link ([`crate::Handout::Link`]).
//!
//! An NFS client keeps a link's text for as long as the link's attributes stay
//! fresh in its cache and their times do not change (see `docs/DESIGN.md`, "Links on
//! the NFS path"): about 1 s after the last reply that carried them, and without
//! bound on a Mac laptop while any call of the mount is being retried after a
//! JUKEBOX. So a copy whose path such a text named is removed only once
//! - it has been taken back ([`LinkHolds::retract`]): no reply names it any more, so
//!   the next reply a client gets carries the link's new text and new times;
//! - [`LINK_HOLD`] has passed since the last reply that named it;
//! - no call was answered JUKEBOX lately ([`LinkHolds::unsettled_until`]).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::Key;

/// How long a copy stays in use after a reply last carried a link's attributes
/// naming it: the clients keep attributes 1 s (`actimeo=1`; macOS stamps them in
/// whole seconds, Linux from the call's start), and a reply may take a moment to
/// arrive.
pub const LINK_HOLD: Duration = Duration::from_secs(3);

/// Which copies are named by links, and which of those are being taken back.
#[derive(Debug, Default)]
pub(crate) struct LinkHolds {
    /// When a reply last named each copy.
    named: HashMap<Key, Instant>,
    /// Copies no reply may name any more: they are about to be removed.
    retracting: HashSet<Key>,
    /// Until when a client may keep attributes past their time (a JUKEBOX lately).
    unsettled_until: Option<Instant>,
}

impl LinkHolds {
    /// Whether a reply may name `key`'s copy now; if so, it is named from now.
    pub(crate) fn name(&mut self, key: &Key) -> bool {
        if self.retracting.contains(key) {
            return false;
        }
        self.named.insert(key.clone(), Instant::now());
        true
    }

    /// How long `key`'s copy must stay, if a client may still follow a link to it.
    pub(crate) fn left(&self, key: &Key) -> Option<Duration> {
        let named = self.named.get(key)?;
        let held = LINK_HOLD.checked_sub(named.elapsed());
        let unsettled = self
            .unsettled_until
            .and_then(|until| until.checked_duration_since(Instant::now()));
        held.into_iter().chain(unsettled).max()
    }

    /// Stops naming `key`'s copy: the next replies carry the link's other text.
    pub(crate) fn retract(&mut self, key: &Key) {
        if self.named.contains_key(key) {
            self.retracting.insert(key.clone());
        }
    }

    /// Whether `key`'s copy is being taken back.
    pub(crate) fn retracting(&self, key: &Key) -> bool {
        self.retracting.contains(key)
    }

    /// Names `key`'s copy again: it was not removed after all.
    pub(crate) fn restore(&mut self, key: &Key) {
        self.retracting.remove(key);
    }

    /// `key`'s copy is gone: nothing is remembered of it.
    pub(crate) fn forget(&mut self, key: &Key) {
        self.named.remove(key);
        self.retracting.remove(key);
    }

    /// A client may keep the attributes it has until `until`, however old.
    pub(crate) fn unsettled_until(&mut self, until: Instant) {
        self.unsettled_until = Some(self.unsettled_until.map_or(until, |was| was.max(until)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Key {
        Key::for_source_path(std::path::Path::new(name))
    }

    #[test]
    fn a_named_copy_is_held_for_the_link_hold_and_no_longer() {
        let mut holds = LinkHolds::default();
        assert_eq!(holds.left(&key("a")), None, "never named");
        assert!(holds.name(&key("a")));
        let left = holds.left(&key("a")).expect("held");
        assert!(left > LINK_HOLD - Duration::from_millis(500) && left <= LINK_HOLD);
        holds.named.insert(key("a"), Instant::now() - LINK_HOLD);
        assert_eq!(holds.left(&key("a")), None);
    }

    #[test]
    fn a_retracted_copy_is_named_no_more_until_restored() {
        let mut holds = LinkHolds::default();
        assert!(holds.name(&key("a")));
        holds.retract(&key("a"));
        assert!(!holds.name(&key("a")));
        holds.restore(&key("a"));
        assert!(holds.name(&key("a")));
    }

    #[test]
    fn a_copy_never_named_is_not_retracted() {
        let mut holds = LinkHolds::default();
        holds.retract(&key("b"));
        assert!(holds.name(&key("b")), "nothing to take back");
    }

    #[test]
    fn while_unsettled_every_named_copy_is_held_however_long_ago() {
        let mut holds = LinkHolds::default();
        assert!(holds.name(&key("a")));
        holds
            .named
            .insert(key("a"), Instant::now() - Duration::from_secs(3600));
        holds.unsettled_until(Instant::now() + Duration::from_secs(40));
        let left = holds.left(&key("a")).expect("held while unsettled");
        assert!(left > Duration::from_secs(39));
        assert_eq!(holds.left(&key("never")), None, "never named");
        holds.forget(&key("a"));
        assert_eq!(holds.left(&key("a")), None);
    }
}
