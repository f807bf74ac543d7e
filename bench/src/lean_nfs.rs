//! A lean READ client for `readbench nfs`: what a kernel client costs, and no more.
//! It receives each reply once into a buffer it reuses, and parses only the READ
//! reply's fixed header, where the `nfs3_client` crate also allocates a buffer per
//! reply and copies the data out of it. The difference between the two rows is the
//! client's own cost, which a measure of the server alone should leave out.

use std::net::SocketAddr;

use anyhow::{Context, bail, ensure};
use nfs3_client::nfs3_types::nfs3::{self as nfs, READ3args, nfs_fh3};
use nfs3_client::nfs3_types::rpc::{RPC_VERSION_2, call_body, msg_body, opaque_auth, rpc_msg};
use nfs3_client::nfs3_types::xdr_codec::Pack;
use stagefs_nfs::client::credential;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One connection that sends READs one at a time.
pub(crate) struct LeanClient {
    stream: TcpStream,
    xid: u32,
    reply: Vec<u8>,
}

impl LeanClient {
    /// Connects to the export at `addr` (from a reserved port, as root).
    pub(crate) async fn connect(addr: SocketAddr) -> anyhow::Result<LeanClient> {
        let stream = stagefs_nfs::access::connect_from_reserved_port(addr)
            .await
            .context("connecting the lean client")?;
        stream.set_nodelay(true)?;
        Ok(LeanClient {
            stream,
            xid: 1,
            reply: Vec::new(),
        })
    }

    /// READs `count` bytes of `fh` at `offset`: the bytes (in a buffer reused by the
    /// next READ) and whether they end the file.
    pub(crate) async fn read(
        &mut self,
        fh: &nfs_fh3,
        offset: u64,
        count: u32,
    ) -> anyhow::Result<(&[u8], bool)> {
        self.xid = self.xid.wrapping_add(1);
        let call = read_call(self.xid, fh, offset, count)?;
        self.stream.write_all(&call).await?;
        self.receive().await?;
        parse_read_reply(&self.reply, self.xid)
    }

    /// Receives one whole reply record into `self.reply`.
    async fn receive(&mut self) -> anyhow::Result<()> {
        self.reply.clear();
        loop {
            let mark = self.stream.read_u32().await?;
            let len = (mark & 0x7fff_ffff) as usize;
            let start = self.reply.len();
            self.reply.resize(start + len, 0);
            self.stream.read_exact(&mut self.reply[start..]).await?;
            if mark & 0x8000_0000 != 0 {
                return Ok(());
            }
        }
    }
}

/// A READ call record, record mark included, from root.
fn read_call(xid: u32, fh: &nfs_fh3, offset: u64, count: u32) -> anyhow::Result<Vec<u8>> {
    let msg = rpc_msg {
        xid,
        body: msg_body::CALL(call_body {
            rpcvers: RPC_VERSION_2,
            prog: nfs::PROGRAM,
            vers: nfs::VERSION,
            proc: nfs::NFS_PROGRAM::NFSPROC3_READ as u32,
            cred: credential(0),
            verf: opaque_auth::default(),
        }),
    };
    let args = READ3args {
        file: fh.clone(),
        offset,
        count,
    };
    let mut call = vec![0; 4];
    msg.pack(&mut call)?;
    args.pack(&mut call)?;
    let len = u32::try_from(call.len() - 4)?;
    call[..4].copy_from_slice(&(len | 0x8000_0000).to_be_bytes());
    Ok(call)
}

/// The data and EOF flag of a successful READ reply to call `xid`.
fn parse_read_reply(reply: &[u8], xid: u32) -> anyhow::Result<(&[u8], bool)> {
    let mut at = 0;
    let mut word = || -> anyhow::Result<u32> {
        let bytes = reply.get(at..at + 4).context("a short reply")?;
        at += 4;
        Ok(u32::from_be_bytes(bytes.try_into()?))
    };
    ensure!(word()? == xid, "a reply to another call");
    ensure!(word()? == 1, "not a reply");
    ensure!(word()? == 0, "the call was denied");
    let _verifier_flavor = word()?;
    let verifier_len = word()?;
    for _ in 0..verifier_len.div_ceil(4) {
        word()?;
    }
    ensure!(word()? == 0, "the call was not accepted");
    let status = word()?;
    if status != 0 {
        bail!("READ answered status {status}");
    }
    if word()? == 1 {
        // fattr3: 21 words.
        for _ in 0..21 {
            word()?;
        }
    }
    let count = word()? as usize;
    let eof = word()? == 1;
    let len = word()? as usize;
    ensure!(len == count, "a READ whose data disagrees with its count");
    let start = at;
    let data = reply
        .get(start..start + len)
        .context("a short READ reply")?;
    Ok((data, eof))
}
