//! A fault-injecting TCP proxy for the database fault tests: it forwards
//! loopback connections to a server and, on command, cuts every open
//! connection at once, cuts each at the server's next reply (after half of
//! its bytes), or delays what it forwards.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct Faults {
    /// Bumped to cut every connection open at the time.
    generation: tokio::sync::watch::Sender<u64>,
    /// Cut each connection at the server's next reply, half-way through it.
    cut_mid_reply: AtomicBool,
    /// Milliseconds to hold every chunk before forwarding it.
    delay_ms: AtomicU64,
}

/// A running proxy; dropping it stops accepting (open connections end
/// with their peers).
pub struct Proxy {
    pub addr: SocketAddr,
    faults: Arc<Faults>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let faults = Arc::new(Faults {
            generation: tokio::sync::watch::Sender::new(0),
            cut_mid_reply: AtomicBool::new(false),
            delay_ms: AtomicU64::new(0),
        });
        let f = faults.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let f = f.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        pipe(client, server, f).await;
                    }
                });
            }
        });
        Proxy { addr, faults, task }
    }

    /// Cuts every connection open now.
    pub fn cut_all(&self) {
        self.faults.generation.send_modify(|g| *g += 1);
    }

    /// While on, each connection is cut half-way through the server's next reply.
    pub fn cut_mid_reply(&self, on: bool) {
        self.faults.cut_mid_reply.store(on, Ordering::SeqCst);
    }

    /// Holds every forwarded chunk this long (zero: no delay).
    pub fn delay(&self, d: Duration) {
        self.faults.delay_ms.store(u64::try_from(d.as_millis()).unwrap_or(u64::MAX), Ordering::SeqCst);
    }
}

async fn pipe(client: TcpStream, server: TcpStream, f: Arc<Faults>) {
    let mut cut = f.generation.subscribe();
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = {
        let f = f.clone();
        async move {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = match cr.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                hold(&f).await;
                if sw.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            hold(&f).await;
            if f.cut_mid_reply.load(Ordering::SeqCst) {
                let _ = cw.write_all(&buf[..n / 2]).await;
                return;
            }
            if cw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Either direction ending, or a cut, drops both halves of both sockets.
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = cut.changed() => {}
    }
}

async fn hold(f: &Faults) {
    let ms = f.delay_ms.load(Ordering::SeqCst);
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}
