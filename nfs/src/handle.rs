//! File handles: the policy's inode number, 8 bytes. The server prefixes every handle
//! with the inode journal's generation, so a handle outlives a restart of the daemon
//! (the journal gives each path and version its old number back) and a handle from a
//! lost journal answers `NFS3ERR_STALE` instead of naming another file.

use nfs3_server::vfs::FileHandle;

/// One inode of the mount, as the client holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeHandle([u8; 8]);

impl NodeHandle {
    /// The handle of inode `ino`.
    pub fn of(ino: u64) -> NodeHandle {
        NodeHandle(ino.to_be_bytes())
    }

    /// The inode this handle names.
    pub fn ino(&self) -> u64 {
        u64::from_be_bytes(self.0)
    }
}

impl FileHandle for NodeHandle {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(NodeHandle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_round_trips_its_inode_and_refuses_other_lengths() {
        let handle = NodeHandle::of(0x0102_0304_0506_0708);
        assert_eq!(NodeHandle::from_bytes(handle.as_bytes()), Some(handle));
        assert_eq!(handle.ino(), 0x0102_0304_0506_0708);
        assert_eq!(NodeHandle::from_bytes(&[1, 2, 3]), None);
    }
}
