//! Logins to a real etcd with user/password authentication: etcd checks
//! each password with bcrypt (tens of ms of its CPU), so a client has at
//! most one login in flight per member, shares the token among its calls,
//! and never throws a login away because a caller stopped waiting for it.
//! Counted at etcd (`Authenticate` calls answered, from the members'
//! metrics).

use std::collections::HashSet;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use shardflake_service::Config;
use shardflake_service::etcd::{Client, EtcdAuth, EtcdError, Kv};
use shardflake_service::issuer::Issuer;
use shardflake_service::lease::Keeper;
use shardflake_service::registry;
use shardflake_testkit::Etcd;

/// A client of `etcd` logging in as root (its password set by
/// [`auth_etcd`]).
fn root_client(etcd: &Etcd, timeout: Duration) -> anyhow::Result<Arc<Client>> {
    root_client_of(&etcd.endpoints, timeout)
}

fn root_client_of(endpoints: &[String], timeout: Duration) -> anyhow::Result<Arc<Client>> {
    let root = EtcdAuth {
        user: "root".into(),
        password: "root-pw".into(),
    };
    Ok(Arc::new(Client::connect(
        endpoints,
        timeout,
        None,
        Some(&root),
    )?))
}

/// An endpoint that takes no connection: a listener whose queue is full
/// (backlog 0, one connection waiting in it), so the kernel drops every
/// SYN to it, as a firewall dropping packets would. Keep both sockets.
fn unanswering_endpoint() -> anyhow::Result<(TcpListener, TcpStream, String)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    // SAFETY: listen(2) again, with another backlog, on a socket we own.
    anyhow::ensure!(
        unsafe { libc::listen(listener.as_raw_fd(), 0) } == 0,
        "listen: {}",
        std::io::Error::last_os_error()
    );
    let addr = listener.local_addr()?;
    let waiting = TcpStream::connect(addr)?;
    let refused = TcpStream::connect_timeout(&addr, Duration::from_millis(200));
    anyhow::ensure!(
        refused
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::TimedOut),
        "a connection to a full queue should go unanswered: {refused:?}"
    );
    Ok((listener, waiting, format!("http://{addr}")))
}

fn auth_etcd() -> anyhow::Result<Etcd> {
    let mut etcd = Etcd::start(1)?;
    etcd.enable_auth("root-pw")?;
    Ok(etcd)
}

/// `per_client` reads started together on each client; their answers.
async fn reads_together(
    clients: &[Arc<Client>],
    per_client: usize,
) -> Vec<Result<Vec<Kv>, EtcdError>> {
    let mut reads = tokio::task::JoinSet::new();
    for client in clients {
        for _ in 0..per_client {
            let client = client.clone();
            reads.spawn(async move { client.range_prefix(b"/login/").await });
        }
    }
    reads.join_all().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_made_together_share_one_login() -> anyhow::Result<()> {
    let etcd = auth_etcd()?;
    let client = root_client(&etcd, Duration::from_secs(5))?;
    let before = etcd.handled("Authenticate").await?;
    // A node's acquisition starts with the grant and the read together.
    for read in reads_together(std::slice::from_ref(&client), 8).await {
        read?;
    }
    client.grant(5).await?;
    assert_eq!(etcd.handled("Authenticate").await? - before, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_its_callers_gave_up_on_is_not_thrown_away() -> anyhow::Result<()> {
    let etcd = auth_etcd()?;
    // The member stops answering while every client logs in (each with two
    // calls at once): every call gives up after its timeout, well within
    // the login's own limit (10 timeouts).
    let timeout = Duration::from_millis(300);
    let clients: Vec<Arc<Client>> = (0..8)
        .map(|_| root_client(&etcd, timeout))
        .collect::<Result<_, _>>()?;
    let before = etcd.handled("Authenticate").await?;
    etcd.signal(0, libc::SIGSTOP)?;
    let first = reads_together(&clients, 2).await;
    etcd.signal(0, libc::SIGCONT)?;
    for answer in &first {
        match answer {
            Err(EtcdError::Busy(_) | EtcdError::Unreachable { .. }) => {}
            other => anyhow::bail!("a call to a stopped member: {other:?}"),
        }
    }
    // Each client's login went on and its token serves the calls now.
    for client in &clients {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            match client.range_prefix(b"/login/").await {
                Ok(_) => break,
                Err(EtcdError::Busy(_)) if tokio::time::Instant::now() < deadline => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    assert_eq!(
        etcd.handled("Authenticate").await? - before,
        clients.len() as u64,
        "one login per client"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_is_renewed_once_for_all_calls() -> anyhow::Result<()> {
    // JWT tokens carry the auth store's revision (simple tokens do not).
    let mut etcd = Etcd::start_jwt(1)?;
    etcd.enable_auth("root-pw")?;
    let client = root_client(&etcd, Duration::from_secs(5))?;
    client.range_prefix(b"/login/").await?;
    let lease = client.grant(30).await?.0;
    client.keep_alive(lease).await?;
    // Any change to the auth store makes etcd refuse the tokens it gave.
    etcd.etcdctl(&["role", "add", "changed"])?;
    let before = etcd.handled("Authenticate").await?;
    for read in reads_together(std::slice::from_ref(&client), 8).await {
        read?;
    }
    assert!(client.keep_alive(lease).await? > 0);
    assert_eq!(etcd.handled("Authenticate").await? - before, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_herd_logging_in_together_starts_on_the_default_timeout() -> anyhow::Result<()> {
    let etcd = auth_etcd()?;
    // 32 logins are about 2 s of bcrypt at etcd here, so they queue: each
    // node's calls (the grant and the read go together) wait for its one
    // login. With a login per call, this herd made 193 (measured).
    let n = 32;
    let dir = tempfile::tempdir()?;
    let mut starts = Vec::with_capacity(n);
    for i in 0..n {
        let config = Config::from_toml(&format!(
            "state_file = {:?}\n[etcd]\nendpoints = {:?}\nprefix = \"/herd\"\n\
             user = \"root\"\npassword = \"root-pw\"\n",
            dir.path().join(format!("{i}.state")),
            etcd.endpoints,
        ))?;
        let registry = registry::for_node_source(&config.node)?;
        starts.push((Arc::new(Issuer::new(config)), registry));
    }
    let before = etcd.handled("Authenticate").await?;
    let (_stop, never) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (issuer, registry)) in starts.into_iter().enumerate() {
        let never = never.clone();
        tasks.spawn(async move {
            let keeper = Keeper::start(issuer.clone(), registry, format!("k{i}"), never).await;
            (issuer, keeper)
        });
    }
    let mut ids = HashSet::new();
    let mut keepers = Vec::with_capacity(n);
    for (issuer, keeper) in tasks.join_all().await {
        keepers.push(keeper?.context("not shut down")?);
        ids.insert(issuer.active().context("no identity")?.node_id);
    }
    assert_eq!(ids, (0..n as u64).collect::<HashSet<_>>());
    assert_eq!(
        etcd.handled("Authenticate").await? - before,
        n as u64,
        "one login per node"
    );
    for mut keeper in keepers {
        keeper.stop().await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_stalled_during_a_login_holds_the_client_a_bounded_time() -> anyhow::Result<()> {
    let mut etcd = Etcd::start(3)?;
    etcd.enable_auth("root-pw")?;
    let stalled = (etcd.leader()? + 1) % 3;
    etcd.signal(stalled, libc::SIGSTOP)?;
    // A client starts on a member picked at random: new clients until one
    // logs in on the stalled member (each does with odds 1/3).
    let timeout = Duration::from_millis(300);
    let mut waited = None;
    for _ in 0..40 {
        let client = root_client(&etcd, timeout)?;
        let started = tokio::time::Instant::now();
        let mut busy = 0;
        let answer = loop {
            match client.range_prefix(b"/stalled/").await {
                Err(EtcdError::Busy(_)) if started.elapsed() < Duration::from_secs(20) => busy += 1,
                other => break other,
            }
        };
        answer?;
        if busy > 0 {
            waited = Some(started.elapsed());
            break;
        }
    }
    etcd.signal(stalled, libc::SIGCONT)?;
    // The login's own limit (10 timeouts: 3.07 s in a probe here) ends it,
    // and the next member answers; the bound leaves room for a loaded
    // machine, and a login without a limit is still waiting at 20 s.
    let waited = waited.context("no client logged in on the stalled member")?;
    assert!(waited < timeout * 30, "held for {waited:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_takes_no_connection_is_passed_over_during_a_login() -> anyhow::Result<()> {
    let etcd = auth_etcd()?;
    let (_listener, _waiting, dead) = unanswering_endpoint()?;
    let endpoints = [dead, etcd.endpoints[0].clone()];
    // A client starts on a member picked at random. One that starts on the
    // dead one gets no connection for its login within the timeout and
    // goes on to etcd in the same call: it may then find etcd at the
    // bcrypt check (busy, never unreachable) when this host is loaded, and
    // the same client's next call waits for that login's answer.
    for _ in 0..12 {
        let client = root_client_of(&endpoints, Duration::from_millis(300))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            match client.range_prefix(b"/dead/").await {
                Ok(_) => break,
                Err(EtcdError::Busy(_)) if tokio::time::Instant::now() < deadline => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}
