//! How much the cache may hold: an upper bound on its size and free space to leave on
//! its volume. Both hold at once; either may be off. The limits themselves
//! ([`Budget`]) are part of the control protocol, which reports them; what they
//! allow is decided here.

use std::io;
use std::path::Path;

pub use stagefs_control::{Budget, VolumeSpace};

use crate::defaults;

/// The default free-space reserve: [`defaults::MIN_FREE_PERCENT`] of the volume, at
/// most [`defaults::MIN_FREE_CAP`].
pub fn default_min_free(volume: VolumeSpace) -> u64 {
    let share = u128::from(volume.total) * u128::from(defaults::MIN_FREE_PERCENT) / 100;
    u64::try_from(share)
        .unwrap_or(u64::MAX)
        .min(defaults::MIN_FREE_CAP)
}

/// Whether `incoming` more bytes fit within `budget` when the cache holds `used`
/// bytes (staged plus reserved) and the volume has `volume.available` bytes free of
/// which `pending` are already promised to copies in progress.
pub fn fits(budget: &Budget, used: u64, pending: u64, incoming: u64, volume: VolumeSpace) -> bool {
    let under_max = budget
        .max_size
        .is_none_or(|max| used.saturating_add(incoming) <= max);
    let keeps_free = budget.min_free.is_none_or(|min| {
        volume
            .available
            .checked_sub(pending.saturating_add(incoming))
            .is_some_and(|left| left >= min)
    });
    under_max && keeps_free
}

/// Space on the volume holding `dir`.
pub fn volume_space(dir: &Path) -> io::Result<VolumeSpace> {
    let st = stagefs_source::sys::statvfs(dir)?;
    #[allow(clippy::unnecessary_cast)] // the field types differ per platform
    let (blocks, avail, frsize) = (st.f_blocks as u64, st.f_bavail as u64, st.f_frsize as u64);
    Ok(VolumeSpace {
        total: blocks.saturating_mul(frsize),
        available: avail.saturating_mul(frsize),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOL: VolumeSpace = VolumeSpace {
        total: 1000,
        available: 500,
    };

    #[test]
    fn max_size_and_min_free_both_hold() {
        let b = Budget {
            max_size: Some(300),
            min_free: Some(100),
        };
        assert!(fits(&b, 200, 0, 100, VOL));
        assert!(!fits(&b, 201, 0, 100, VOL), "over max_size");
        assert!(
            !fits(&b, 0, 250, 200, VOL),
            "would leave less than min_free"
        );
        assert!(fits(&Budget::default(), u64::MAX - 1, 0, 1, VOL));
    }
}
