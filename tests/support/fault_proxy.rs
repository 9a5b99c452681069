//! A TCP proxy between the fleet and one server, for fault tests: it forwards bytes both ways
//! and, on the test's word, adds latency, pauses (holds every byte, accepts and holds new
//! connections: a server frozen with SIGSTOP), cuts the connections it carries (a dropped
//! link: each is reset, new ones pass) or takes the server away (every connection reset, new
//! ones reset at once: a stopped server), and brings it back. Only the processes pointed at
//! the proxy see the fault; the shared server and other tests do not.

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

/// What the proxy does to traffic now.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Conditions {
    /// Added to every chunk, each way.
    latency: Duration,
    /// Nothing moves; new connections wait.
    paused: bool,
    /// The server is away: connections reset, new ones too.
    down: bool,
    /// Bumped by every cut: connections opened before it are reset.
    cuts: u64,
}

pub struct FaultProxy {
    pub port: u16,
    conditions: watch::Sender<Conditions>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy on a free port of 127.0.0.1 to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> anyhow::Result<FaultProxy> {
        let upstream: SocketAddr = tokio::net::lookup_host(upstream)
            .await?
            .next()
            .ok_or_else(|| anyhow::anyhow!("no address for {upstream}"))?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (conditions, rx) = watch::channel(Conditions::default());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(serve(client, upstream, rx.clone()));
            }
        });
        Ok(FaultProxy {
            port,
            conditions,
            task,
        })
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Adds `latency` to every chunk each way (zero: none).
    pub fn set_latency(&self, latency: Duration) {
        self.conditions.send_modify(|c| c.latency = latency);
    }

    /// Holds every byte and every new connection until `resume`.
    pub fn pause(&self) {
        self.conditions.send_modify(|c| c.paused = true);
    }

    pub fn resume(&self) {
        self.conditions.send_modify(|c| c.paused = false);
    }

    /// Resets every connection it carries; new ones pass.
    pub fn cut(&self) {
        self.conditions.send_modify(|c| c.cuts += 1);
    }

    /// The server goes away: every connection reset, new ones reset at once, until `up`.
    pub fn down(&self) {
        self.conditions.send_modify(|c| {
            c.down = true;
            c.cuts += 1;
        });
    }

    /// The server is back: returns the moment from which a recovery is measured.
    pub fn up(&self) -> Instant {
        self.conditions.send_modify(|c| c.down = false);
        Instant::now()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.down();
    }
}

/// One client connection: forwarded until either side closes or a cut resets it.
async fn serve(client: TcpStream, upstream: SocketAddr, mut rx: watch::Receiver<Conditions>) {
    let born = rx.borrow().cuts;
    if rx.wait_for(|c| !c.paused || c.down).await.is_err() || rx.borrow().down {
        reset(client);
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        reset(client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let mut cut = rx.clone();
    // Whichever ends first ends the connection: the halves, moved into the pipes, are dropped
    // with them, so both peers see it end (nothing is left half open).
    tokio::select! {
        _ = pipe(client_read, server_write, rx.clone()) => {}
        _ = pipe(server_read, client_write, rx.clone()) => {}
        _ = cut.wait_for(|c| c.cuts != born) => {}
    }
}

/// Closes a connection the proxy will not carry (the server is away): the client sees its
/// connection end before anything was answered.
fn reset(stream: TcpStream) {
    drop(stream);
}

/// Copies `from` to `to`, each chunk held for the latency of the moment it was read and while
/// the proxy is paused.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, rx: watch::Receiver<Conditions>) {
    let (tx, mut chunks) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = {
        let rx = rx.clone();
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match from.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let due = Instant::now() + rx.borrow().latency;
                        if tx.send((due, buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                }
            }
        }
    };
    let writer = async move {
        let mut rx = rx;
        while let Some((due, bytes)) = chunks.recv().await {
            tokio::time::sleep_until(due.into()).await;
            if rx.wait_for(|c| !c.paused).await.is_err() || to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}
