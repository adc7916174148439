//! Connections that give up on a server that stops answering.
//!
//! A PostgreSQL server stopped (SIGSTOP, a frozen VM, a host that hangs)
//! after a command connected to it never answers a statement, and nothing
//! else ends the wait: its kernel still acknowledges the bytes sent, so no
//! TCP timeout fires. A deadline per statement cannot tell that from a
//! statement that is rightly slow (waiting for the deployment lock while
//! another operator's move runs, copying a large shard), so the watch is
//! on the server instead: a connection waiting for an answer (a request
//! sent whose `ReadyForQuery` has not come back) that has read nothing for
//! [`SILENCE`] asks the server, on a new connection, for `SELECT 1`. An
//! idle connection (a [`Router`](super::Router)'s between requests) asks
//! nothing, so a pool of them costs the server no connections. A
//! server that answers is alive and the wait goes on; one that gives no
//! answer within [`PROBE`] is declared stopped, the connection is closed,
//! and every statement on it fails with [`Error::Unresponsive`], naming
//! the server and what the command was doing. The command then stops as it
//! stops on any error: its open transactions roll back (on the stopped
//! server when it runs again and finds the connection gone), what it
//! committed stays, and `pg check` reports what is left.
//!
//! Only a whole server stopped is seen: a backend stopped alone, behind a
//! postmaster that still answers, looks alive.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
#[cfg(unix)]
use tokio::net::UnixStream;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep};
use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, NoTls};

use crate::Error;

/// How long a connection may read nothing before the server is asked
/// whether it is alive.
pub const SILENCE: Duration = Duration::from_secs(10);

/// How long the server has to answer that question (a new connection and
/// `SELECT 1`), and the connect itself (socket and start-up) when the URL
/// sets no `connect_timeout`.
pub const PROBE: Duration = Duration::from_secs(5);

/// Servers given up on, by the name the command connected them under, with
/// why: a statement on a closed connection fails with "connection closed",
/// and [`gave_up`] turns that back into what happened.
static GAVE_UP: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());

/// Why the connection named `server` was given up on, if the error is its
/// closing.
pub(crate) fn gave_up(server: &str, e: &tokio_postgres::Error) -> Option<String> {
    if !e.is_closed() {
        return None;
    }
    GAVE_UP.lock().ok()?.get(server).cloned()
}

/// Connects to a server under the watch (`name` is the server's name in
/// errors).
pub(crate) async fn connect(name: &str, url: &str, config: Config) -> Result<Client, Error> {
    let err = |source: Box<dyn std::error::Error + Send + Sync>| Error::Connect {
        server: name.to_string(),
        url: url.to_string(),
        source,
    };
    let limit = config.get_connect_timeout().copied().unwrap_or(PROBE);
    let connect = async {
        let stream = open(&config, limit).await.map_err(|e| err(e.into()))?;
        let watched = Watched::new(name, config.clone(), stream);
        config
            .connect_raw(watched, NoTls)
            .await
            .map_err(|e| err(e.into()))
    };
    // The socket's connect is bounded by `limit`; the start-up after it
    // (a stopped server accepts the socket, then says nothing) as long.
    let (client, connection) = tokio::time::timeout(limit * 2, connect)
        .await
        .map_err(|_| {
            err(format!(
                "no answer to the connection's start-up within {} s (the server is stopped or hung)",
                (limit * 2).as_secs()
            )
            .into())
        })??;
    if let Ok(mut gave_up) = GAVE_UP.lock() {
        gave_up.remove(name);
    }
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Opens the socket to the first of the config's hosts that takes it, as
/// `tokio_postgres::Config::connect` would.
async fn open(config: &Config, limit: Duration) -> io::Result<Stream> {
    let (hosts, addrs, ports) = (
        config.get_hosts(),
        config.get_hostaddrs(),
        config.get_ports(),
    );
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the URL names no host");
    for i in 0..hosts.len().max(addrs.len()) {
        // One port for every host, or one each; 5432 when none.
        let port = ports
            .get(i)
            .or_else(|| ports.first())
            .copied()
            .unwrap_or(5432);
        let attempt = async {
            match (addrs.get(i), hosts.get(i)) {
                (Some(ip), _) => TcpStream::connect((*ip, port)).await.map(Stream::Tcp),
                (None, Some(Host::Tcp(host))) => TcpStream::connect((host.as_str(), port))
                    .await
                    .map(Stream::Tcp),
                #[cfg(unix)]
                (None, Some(Host::Unix(dir))) => {
                    UnixStream::connect(dir.join(format!(".s.PGSQL.{port}")))
                        .await
                        .map(Stream::Unix)
                }
                _ => Err(io::Error::new(io::ErrorKind::Unsupported, "host kind")),
            }
        };
        match tokio::time::timeout(limit, attempt).await {
            Ok(Ok(stream)) => {
                if let Stream::Tcp(s) = &stream {
                    s.set_nodelay(true)?;
                }
                return Ok(stream);
            }
            Ok(Err(e)) => last = e,
            Err(_) => {
                last = io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connect timed out after {} s", limit.as_secs()),
                )
            }
        }
    }
    Err(last)
}

/// Whether the server answers a new connection and `SELECT 1` within
/// [`PROBE`]. An error the server sends (too many clients, a role refused)
/// is an answer; a refused or silent socket is not.
async fn answers(config: Config) -> bool {
    let ask = async {
        let (client, connection) = config.connect(NoTls).await?;
        tokio::spawn(connection);
        client.simple_query("SELECT 1").await.map(drop)
    };
    match tokio::time::timeout(PROBE, ask).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => e.as_db_error().is_some(),
        Err(_) => false,
    }
}

/// A TCP or Unix socket.
enum Stream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
}

/// A connection's socket, watching the server's silence (the module's
/// doc).
struct Watched {
    stream: Stream,
    /// To ask the server on a new connection.
    config: Config,
    server: String,
    /// When the silence runs out.
    silence: Pin<Box<Sleep>>,
    /// The question in flight.
    probe: Option<JoinHandle<bool>>,
    /// The messages sent that each end in a `ReadyForQuery`, and those
    /// read: while fewer are read, an answer is awaited.
    sent: Framing,
    read: Framing,
}

impl Watched {
    fn new(server: &str, config: Config, stream: Stream) -> Self {
        Watched {
            stream,
            config,
            server: server.to_string(),
            silence: Box::pin(tokio::time::sleep(SILENCE)),
            probe: None,
            // The start-up message has no type byte and ends in a
            // `ReadyForQuery`, as does each simple query and each Sync.
            sent: Framing::new(true, b"QS"),
            read: Framing::new(false, b"Z"),
        }
    }

    /// Whether a request is waiting for its answer.
    fn awaiting(&self) -> bool {
        self.sent.counted > self.read.counted
    }

    /// Pending while the server is alive or not yet asked; the error that
    /// closes the connection once it gave no answer.
    fn poll_stopped(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            if let Some(probe) = &mut self.probe {
                let alive = ready!(Pin::new(probe).poll(cx)).unwrap_or(true);
                self.probe = None;
                if !alive {
                    let why = format!(
                        "it sent nothing for {} s and a new connection got no answer within {} s: it is stopped (SIGSTOP, a frozen host) or hung",
                        SILENCE.as_secs(),
                        PROBE.as_secs()
                    );
                    tracing::warn!(server = %self.server, "gave up on the server: {why}");
                    // Recorded before the connection closes: the statements
                    // waiting on it fail as it does.
                    if let Ok(mut gave_up) = GAVE_UP.lock() {
                        gave_up.insert(self.server.clone(), why.clone());
                    }
                    return Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, why));
                }
                self.silence.as_mut().reset(Instant::now() + SILENCE);
            }
            ready!(self.silence.as_mut().poll(cx));
            self.probe = Some(tokio::spawn(answers(self.config.clone())));
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = match &mut this.stream {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            #[cfg(unix)]
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        };
        if read.is_ready() {
            // Anything read, an end or an error included, is an answer.
            this.read.feed(&buf.filled()[before..]);
            this.silence.as_mut().reset(Instant::now() + SILENCE);
            if let Some(probe) = this.probe.take() {
                probe.abort();
            }
            return read;
        }
        if !this.awaiting() {
            return Poll::Pending;
        }
        this.poll_stopped(cx).map(Err)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = match &mut this.stream {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            #[cfg(unix)]
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        };
        if let Poll::Ready(Ok(n)) = written {
            let idle = !this.awaiting();
            this.sent.feed(&buf[..n]);
            if idle && this.awaiting() {
                // The silence counts from the request; polled here so that
                // it wakes this task even if the server never answers.
                this.silence.as_mut().reset(Instant::now() + SILENCE);
                let _ = this.silence.as_mut().poll(cx);
            }
        }
        written
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            #[cfg(unix)]
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            #[cfg(unix)]
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Splits a protocol stream into its messages (a type byte, then a length
/// that counts itself and the body) to count those of some types.
struct Framing {
    /// The next message is the start-up, which has no type byte (first
    /// on a connection) and is counted.
    startup: bool,
    header: [u8; 5],
    have: usize,
    /// Body bytes of the current message still to skip.
    left: usize,
    counts: &'static [u8],
    counted: u64,
}

impl Framing {
    fn new(startup: bool, counts: &'static [u8]) -> Self {
        Framing {
            startup,
            header: [0; 5],
            have: 0,
            left: 0,
            counts,
            counted: 0,
        }
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.left > 0 {
                let skip = self.left.min(bytes.len());
                self.left -= skip;
                bytes = &bytes[skip..];
                continue;
            }
            let start = usize::from(self.startup);
            let take = (5 - start - self.have).min(bytes.len());
            self.header[start + self.have..start + self.have + take]
                .copy_from_slice(&bytes[..take]);
            self.have += take;
            bytes = &bytes[take..];
            if start + self.have < 5 {
                return;
            }
            if std::mem::take(&mut self.startup) || self.counts.contains(&self.header[0]) {
                self.counted += 1;
            }
            let len = u32::from_be_bytes([
                self.header[1],
                self.header[2],
                self.header[3],
                self.header[4],
            ]);
            self.left = (len as usize).saturating_sub(4);
            self.have = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn startup() -> Vec<u8> {
        let mut m = 8u32.to_be_bytes().to_vec();
        m.extend_from_slice(&196_608u32.to_be_bytes());
        m
    }

    #[test]
    fn requests_and_their_answers_are_counted_across_any_split() {
        let mut sent = startup();
        sent.extend(message(b'P', b"SELECT 1\0\0\0"));
        sent.extend(message(b'S', b""));
        sent.extend(message(b'Q', b"SELECT 'QS'\0"));
        let mut read = message(b'R', &[0; 4]);
        read.extend(message(b'Z', b"I"));
        read.extend(message(b'D', b"ZZZZZZZZ"));
        read.extend(message(b'Z', b"T"));
        for size in 1..=7 {
            let (mut s, mut r) = (Framing::new(true, b"QS"), Framing::new(false, b"Z"));
            sent.chunks(size).for_each(|c| s.feed(c));
            read.chunks(size).for_each(|c| r.feed(c));
            assert_eq!((s.counted, r.counted), (3, 2), "chunks of {size}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_asks_nothing_and_an_unanswered_request_is_given_up() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut config = Config::new();
        config.host("127.0.0.1").port(port).user("u");
        let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let mut conn = Watched::new("s", config, Stream::Tcp(stream));
        let mut buf = [0u8; 64];

        conn.write_all(&startup()).await.unwrap();
        server.write_all(&message(b'Z', b"I")).await.unwrap();
        assert_eq!(conn.read(&mut buf).await.unwrap(), 6);

        // Idle a minute: the server is asked nothing, the connection lives.
        let idle = tokio::time::timeout(SILENCE * 6, conn.read(&mut buf)).await;
        assert!(idle.is_err(), "the idle connection ended: {idle:?}");
        let asked = tokio::time::timeout(Duration::from_millis(1), listener.accept()).await;
        assert!(asked.is_err(), "the idle connection asked the server");

        // A request the server never answers, nor the question: given up.
        let sent = Instant::now();
        conn.write_all(&message(b'Q', b"SELECT 1\0")).await.unwrap();
        let read = tokio::time::timeout(SILENCE * 6, conn.read(&mut buf)).await;
        let e = read.expect("not given up").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(sent.elapsed() >= SILENCE, "{:?}", sent.elapsed());
        drop(server);
    }
}
