//! One place for the marks of every client: the servers record where
//! `init` was told the marks are kept (the file's `[marks]`), and every
//! session, `init` and `check` refuse a file that names another place;
//! `reshape` with that file moves the marks there. Each on real servers
//! and etcd; each failed on the code before (see the note on each).

use std::path::{Path, PathBuf};

use shardflake_testkit::{Etcd, MariaDbServer, PgServer};
use shardflake_tickets::high_water::stores;
use shardflake_tickets::{Config, PeersStore, TicketClient, admin};

use super::live_restore::{pg_dump, psql};
use super::repro::{FIXED, dump, restore};
use super::{assert_unique, etcd_marks, init_ok, maria, server_toml};

/// A pair of `kind` keeping its marks in `etcd` under `prefix` (each
/// place given 2 s: an etcd slow under load is not what this is about),
/// per-id marks 10 ids ahead (so the ids handed out go past them).
fn pair(kind: &str, a: &str, b: &str, etcd: &Etcd, prefix: &str) -> Config {
    let servers = format!(
        "{}{}",
        server_toml("a", kind, a, 1),
        server_toml("b", kind, b, 2)
    );
    pair_of(&servers, etcd, prefix)
}

/// [`pair`] with `servers` (their `[[servers]]` tables, in any order).
fn pair_of(servers: &str, etcd: &Etcd, prefix: &str) -> Config {
    let fixed = FIXED.replace(
        "attempt_timeout_ms = 1000\n",
        "attempt_timeout_ms = 3000\nmarks_timeout_ms = 2000\nmark_ahead = 10\n",
    );
    Config::parse(&format!("{servers}{fixed}{}", etcd_marks(etcd, prefix))).unwrap()
}

/// A fresh client of `config`, whatever it can use.
async fn fresh(config: &Config) -> TicketClient {
    TicketClient::start_with_store(config.clone(), stores(PeersStore::new(config.clone()))).await
}

/// Per-id and segment ids from `client`; a refused or unavailable call
/// hands out nothing and is fine here. The last error, if any.
async fn take(
    client: &TicketClient,
    rounds: usize,
    photos: &mut Vec<u64>,
    blocks: &mut Vec<u64>,
) -> Option<String> {
    let mut error = None;
    for _ in 0..rounds {
        match client.next_n("photos", 100).await {
            Ok(got) => photos.extend(got),
            Err(e) => error = Some(e.to_string()),
        }
        match client.next_n("blocks", 2000).await {
            Ok(got) => blocks.extend(got),
            Err(e) => error = Some(e.to_string()),
        }
    }
    error
}

/// Two tickets files that differ only in `etcd_prefix`. A client of the
/// first hands out ids while `b` is down (so `a`'s marks are on `a` and in
/// etcd under `/one` only), then `a` is restored from a dump of before and
/// `b` comes back. A fresh client of the second file would find `a`'s
/// marks neither on `b` nor under `/two`: it is refused on both servers
/// (the servers record that their marks are under `/one`), and so are
/// `init` and `check` with that file. `reshape` with it moves the marks:
/// `a` is raised past the marks under `/one`, and from then on the second
/// file's clients serve and the first's are refused. Before: `init` and
/// `check` passed with the second file and its client handed out ids of
/// the first's again (257 of 1,100 per-id ids twice on MariaDB, 249 on
/// PostgreSQL); and a reshape that read the marks under the new prefix
/// and on the servers only (not under `/one`) let the second file's
/// client hand out 204 (MariaDB) and 200 (PostgreSQL) of them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_file_naming_another_etcd_prefix_is_refused_until_reshape_moves_the_marks_mariadb() {
    let etcd = Etcd::start(1).unwrap();
    let (a, b) = (maria(2, 1), maria(2, 2));
    let (one, two) = (
        pair("mariadb", &a.url(), &b.url(), &etcd, "/one"),
        pair("mariadb", &a.url(), &b.url(), &etcd, "/two"),
    );
    another_prefix(
        [one, two],
        [&a, &b],
        |s: &MariaDbServer| s.kill().unwrap(),
        |s: &MariaDbServer| s.restart().unwrap(),
        |s: &MariaDbServer| dump(s, "stores-night"),
        |s: &MariaDbServer, path: &Path| restore(s, path),
    )
    .await;
}

/// The same on PostgreSQL (the default table style; the dump recreates
/// every table, `pg_dump --clean`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_file_naming_another_etcd_prefix_is_refused_until_reshape_moves_the_marks_postgres() {
    let etcd = Etcd::start(1).unwrap();
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let (one, two) = (
        pair("postgres", &a.url(), &b.url(), &etcd, "/one"),
        pair("postgres", &a.url(), &b.url(), &etcd, "/two"),
    );
    another_prefix(
        [one, two],
        [&a, &b],
        |s: &PgServer| s.kill().unwrap(),
        |s: &PgServer| s.restart().unwrap(),
        |s: &PgServer| pg_dump(s, "stores-night", &["--clean"]),
        |s: &PgServer, path: &Path| psql(s, &[], path),
    )
    .await;
}

/// The scenario of the tests above: `one` and `two` name the same
/// servers `[a, b]` and etcd under two prefixes.
async fn another_prefix<S>(
    [one, two]: [Config; 2],
    [a, b]: [&S; 2],
    kill: impl Fn(&S),
    restart: impl Fn(&S),
    dump: impl Fn(&S) -> PathBuf,
    restore: impl Fn(&S, &Path),
) {
    init_ok(&one).await;
    let night = dump(a);
    let (mut photos, mut blocks) = (Vec::new(), Vec::new());
    let first = TicketClient::connect(one.clone()).await.unwrap();
    take(&first, 2, &mut photos, &mut blocks).await;
    // The first client goes on with `b` down (`a` and etcd are two of the
    // three places): `a`'s marks are on `a` and under `/one` only.
    kill(b);
    take(&first, 4, &mut photos, &mut blocks).await;
    assert!(super::calls(&first, "a") > 0, "{:?}", first.metrics());
    first.shutdown().await;
    drop(first);
    restore(a, &night);
    let _ = std::fs::remove_file(&night);
    restart(b);

    let second = fresh(&two).await;
    let error = take(&second, 5, &mut photos, &mut blocks).await;
    second.shutdown().await;
    drop(second);
    assert_unique(&photos);
    assert_unique(&blocks);
    let error = error.expect("the second file's client was refused");
    assert!(
        error.contains("keep their marks in peers + etcd /one"),
        "{error}"
    );
    assert!(error.contains("tickets reshape"), "{error}");

    // `init` and `check` with the second file say the same, and `init`
    // changed no server.
    for s in admin::init(&two).await {
        let e = s.result.unwrap_err().to_string();
        assert!(
            e.contains("this file's [marks] names peers + etcd /two"),
            "{e}"
        );
    }
    let report = admin::check(&two).await;
    assert!(!report.ok(), "{report}");
    assert_eq!(
        report
            .problems
            .iter()
            .filter(|p| p.contains("keep their marks in peers + etcd /one"))
            .count(),
        2,
        "{report}"
    );
    // (The first file's check reports `a` behind its marks, restored:
    // not a place problem.)
    let report = admin::check(&one).await;
    assert!(
        !report
            .problems
            .iter()
            .any(|p| p.contains("keep their marks")),
        "{report}"
    );

    // The way out: reshape with the second file reads the marks under
    // `/one` too, raises `a` past them, and records `/two`.
    let store = admin::admin_store(&two);
    let moved = admin::reshape(&two, &*store).await.unwrap();
    assert_eq!(moved.len(), 2, "{moved:?}");
    let report = admin::check(&two).await;
    assert!(report.ok(), "{report}");
    let second = fresh(&two).await;
    assert_eq!(take(&second, 4, &mut photos, &mut blocks).await, None);
    assert!(super::calls(&second, "a") > 0, "{:?}", second.metrics());
    second.shutdown().await;
    assert_unique(&photos);
    assert_unique(&blocks);
    // Now the first file is the other one.
    let first = fresh(&one).await;
    let error = take(&first, 1, &mut photos, &mut blocks).await.unwrap();
    assert!(
        error.contains("keep their marks in peers + etcd /two"),
        "{error}"
    );
    first.shutdown().await;
    assert_unique(&photos);
    assert_unique(&blocks);
}

/// A mark place a reshape moved away from never vouches again, whatever
/// the servers say. Files `pa` and `pb` name the same pair and differ only
/// in `etcd_prefix`; `init` with `pa`, a client of it, dumps of both
/// servers, `reshape` with `pb`, a client of it; then both servers are
/// restored from the dumps of before the reshape, so they record `pa`'s
/// place again. A fresh client of `pa` reads `/pa`'s stale marks and the
/// restored peers only: it is refused by what `reshape` left at `/pa`
/// (`moved_to`, which no server dump rolls back), naming the place the
/// marks moved to and the reshape that gets out of it; `reshape` with
/// `pb` again lets `pb`'s clients serve, past every id. Before (an
/// operator's review, E9b): the `pa` client was accepted and handed out
/// `pb`'s ids again (on this test, `assert_unique` failed on the per-id
/// and segment ids after the restore).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_place_reshape_moved_away_from_is_refused_after_both_servers_are_restored_mariadb() {
    let etcd = Etcd::start(1).unwrap();
    let (a, b) = (maria(2, 1), maria(2, 2));
    let (pa, pb) = (
        pair("mariadb", &a.url(), &b.url(), &etcd, "/pa"),
        pair("mariadb", &a.url(), &b.url(), &etcd, "/pb"),
    );
    init_ok(&pa).await;
    let (mut photos, mut blocks) = (Vec::new(), Vec::new());
    let first = fresh(&pa).await;
    assert_eq!(take(&first, 2, &mut photos, &mut blocks).await, None);
    first.shutdown().await;
    drop(first);
    let nights = [dump(&a, "moved-a"), dump(&b, "moved-b")];

    let store = admin::admin_store(&pb);
    admin::reshape(&pb, &*store).await.unwrap();
    let second = fresh(&pb).await;
    assert_eq!(take(&second, 4, &mut photos, &mut blocks).await, None);
    second.shutdown().await;
    drop(second);
    assert_unique(&photos);
    assert_unique(&blocks);

    // Both servers back to before the reshape: they record `/pa` again.
    restore(&a, &nights[0]);
    restore(&b, &nights[1]);
    for night in &nights {
        let _ = std::fs::remove_file(night);
    }
    let stale = fresh(&pa).await;
    let error = take(&stale, 4, &mut photos, &mut blocks).await;
    stale.shutdown().await;
    drop(stale);
    assert_unique(&photos);
    assert_unique(&blocks);
    let error = error.expect("the client of the place moved away from was refused");
    assert!(
        error.contains("the marks moved to peers + etcd /pb"),
        "{error}"
    );
    assert!(error.contains("tickets reshape --config"), "{error}");
    // `init` with `pa`'s file is refused as its clients are, naming the
    // reshape (before: "ok", "ids from N on", and its clients refused).
    for s in admin::init(&pa).await {
        let e = s
            .result
            .expect_err("init with the file moved away from")
            .to_string();
        assert!(e.contains("the marks moved to peers + etcd /pb"), "{e}");
        assert!(e.contains("tickets reshape --config"), "{e}");
    }
    // `pb`'s clients are refused by the restored servers, without being
    // sent back to `pa`'s file.
    let refused = fresh(&pb).await;
    let error = take(&refused, 1, &mut photos, &mut blocks).await.unwrap();
    refused.shutdown().await;
    drop(refused);
    assert!(
        !error.contains("use the file the servers were initialised with"),
        "{error}"
    );
    assert!(error.contains("tickets reshape --config"), "{error}");

    // The way out: reshape with `pb` again.
    admin::reshape(&pb, &*store).await.unwrap();
    let again = fresh(&pb).await;
    assert_eq!(take(&again, 4, &mut photos, &mut blocks).await, None);
    again.shutdown().await;
    assert_unique(&photos);
    assert_unique(&blocks);
}

/// The same, with the client of `pa` left running from before the
/// reshape, idle through it and the restore (its pooled sessions are
/// pinned to the lattice version the restore brings back): at its next
/// calls it hands out no id `pb`'s client got, refused at its next marks
/// read or write at `/pa`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_left_running_on_a_place_moved_away_from_hands_out_nothing_twice_mariadb() {
    let etcd = Etcd::start(1).unwrap();
    let (a, b) = (maria(2, 1), maria(2, 2));
    let (pa, pb) = (
        pair("mariadb", &a.url(), &b.url(), &etcd, "/pa"),
        pair("mariadb", &a.url(), &b.url(), &etcd, "/pb"),
    );
    init_ok(&pa).await;
    let (mut photos, mut blocks) = (Vec::new(), Vec::new());
    let old = fresh(&pa).await;
    assert_eq!(take(&old, 2, &mut photos, &mut blocks).await, None);
    let nights = [dump(&a, "left-a"), dump(&b, "left-b")];

    let store = admin::admin_store(&pb);
    admin::reshape(&pb, &*store).await.unwrap();
    let new = fresh(&pb).await;
    assert_eq!(take(&new, 4, &mut photos, &mut blocks).await, None);
    new.shutdown().await;
    drop(new);

    restore(&a, &nights[0]);
    restore(&b, &nights[1]);
    for night in &nights {
        let _ = std::fs::remove_file(night);
    }
    let error = take(&old, 4, &mut photos, &mut blocks).await;
    old.shutdown().await;
    assert_unique(&photos);
    assert_unique(&blocks);
    let error = error.expect("the client left running was refused");
    assert!(error.contains("tickets reshape --config"), "{error}");
}

/// A reshape back to a place moved away from makes it vouch again, and
/// the place it leaves is refused from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reshape_back_to_a_place_moved_away_from_serves_from_it_again_mariadb() {
    let etcd = Etcd::start(1).unwrap();
    let (a, b) = (maria(2, 1), maria(2, 2));
    let (pa, pb) = (
        pair("mariadb", &a.url(), &b.url(), &etcd, "/pa"),
        pair("mariadb", &a.url(), &b.url(), &etcd, "/pb"),
    );
    init_ok(&pa).await;
    let (mut photos, mut blocks) = (Vec::new(), Vec::new());
    for (to, from) in [(&pb, &pa), (&pa, &pb)] {
        let store = admin::admin_store(to);
        admin::reshape(to, &*store).await.unwrap();
        let client = fresh(to).await;
        assert_eq!(take(&client, 2, &mut photos, &mut blocks).await, None);
        client.shutdown().await;
        drop(client);
        let report = admin::check(to).await;
        assert!(report.ok(), "{report}");
        let refused = fresh(from).await;
        assert!(take(&refused, 1, &mut photos, &mut blocks).await.is_some());
        refused.shutdown().await;
    }
    assert_unique(&photos);
    assert_unique(&blocks);
}

/// The marks moved `/pa` → `/pb`, both servers restored from before that
/// reshape (they record `/pa`), then reshaped to a third place `/pc` (what
/// the refusal offers a client of any other file): the reshape follows
/// `/pa`'s record of where the marks went and reads `/pb` too, so `/pc`'s
/// clients hand out none of `/pb`'s ids (a review found 50 of 50 again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reshape_after_a_restore_follows_the_marks_to_where_they_moved_mariadb() {
    let etcd = Etcd::start(1).unwrap();
    let (a, b) = (maria(2, 1), maria(2, 2));
    let [pa, pb, pc] = ["/pa", "/pb", "/pc"].map(|p| pair("mariadb", &a.url(), &b.url(), &etcd, p));
    init_ok(&pa).await;
    let (mut photos, mut blocks) = (Vec::new(), Vec::new());
    let first = fresh(&pa).await;
    assert_eq!(take(&first, 2, &mut photos, &mut blocks).await, None);
    first.shutdown().await;
    drop(first);
    let nights = [dump(&a, "chain-a"), dump(&b, "chain-b")];

    admin::reshape(&pb, &*admin::admin_store(&pb))
        .await
        .unwrap();
    let second = fresh(&pb).await;
    assert_eq!(take(&second, 8, &mut photos, &mut blocks).await, None);
    second.shutdown().await;
    drop(second);

    restore(&a, &nights[0]);
    restore(&b, &nights[1]);
    for night in &nights {
        let _ = std::fs::remove_file(night);
    }
    admin::reshape(&pc, &*admin::admin_store(&pc))
        .await
        .unwrap();
    let third = fresh(&pc).await;
    assert_eq!(take(&third, 4, &mut photos, &mut blocks).await, None);
    third.shutdown().await;
    drop(third);
    assert_unique(&photos);
    assert_unique(&blocks);
    // `/pb` was told too: its clients are refused from now on.
    let stale = fresh(&pb).await;
    let error = take(&stale, 1, &mut photos, &mut blocks).await;
    stale.shutdown().await;
    assert_unique(&photos);
    assert!(
        error.is_some(),
        "a client of /pb was served after the marks left it"
    );
}

/// Where `server` records that its clients keep their marks ("" for no
/// record).
fn marks_at(server: &MariaDbServer) -> String {
    server
        .sql("SELECT places FROM shardflake_ticket_marks_at")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Review finding E6: two `init`s run at once with files naming different
/// mark places (`/pa`, `/pb`), each listing the servers in another order,
/// so each records its place on its first server before it reads the
/// other's record on its second. Before: both were refused but left `a`
/// recording `/pa` and `b` `/pb`, and each file's clients then handed out
/// ids from one of the servers. Now a run that finds a server recording
/// another place after its own writes takes back what it recorded: no
/// two servers record different places, the clients of neither file are
/// served by a part of the pair, and `init` again with the file meant
/// makes the pair whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_inits_at_once_with_different_mark_places_leave_no_split_mariadb() {
    let etcd = Etcd::start(1).unwrap();
    let (a, b) = (maria(2, 1), maria(2, 2));
    let pa = pair("mariadb", &a.url(), &b.url(), &etcd, "/pa");
    let b_first = format!(
        "{}{}",
        server_toml("b", "mariadb", &b.url(), 2),
        server_toml("a", "mariadb", &a.url(), 1)
    );
    let pb = pair_of(&b_first, &etcd, "/pb");
    let (ia, ib) = tokio::join!(admin::init(&pa), admin::init(&pb));
    let refused = |run: &[admin::ServerInit]| run.iter().any(|s| s.result.is_err());
    assert!(refused(&ia) || refused(&ib), "both inits passed");
    let (at_a, at_b) = (marks_at(&a), marks_at(&b));
    assert!(
        at_a.is_empty() || at_b.is_empty() || at_a == at_b,
        "the servers record different places: a {at_a:?}, b {at_b:?}"
    );
    for (run, said) in [(&ia, "pa"), (&ib, "pb")] {
        for s in run.iter().filter_map(|s| s.result.as_ref().err()) {
            let e = s.to_string();
            assert!(
                e.contains("tickets init") || e.contains("tickets reshape"),
                "{said}: {e}"
            );
        }
    }
    // The file meant, again (the one whose run went through, if one did;
    // which one wins the race is up to the scheduler): both servers record
    // its place and serve, and a client of the other file is refused.
    let (meant, other) = if !refused(&ib) {
        (&pb, &pa)
    } else {
        (&pa, &pb)
    };
    init_ok(meant).await;
    assert_eq!(marks_at(&a), marks_at(&b));
    let (mut photos, mut blocks) = (Vec::new(), Vec::new());
    let client = fresh(meant).await;
    assert_eq!(take(&client, 2, &mut photos, &mut blocks).await, None);
    client.shutdown().await;
    assert!(photos.iter().any(|id| id % 2 == 1) && photos.iter().any(|id| id % 2 == 0));
    let other = fresh(other).await;
    let error = take(&other, 1, &mut photos, &mut blocks).await;
    other.shutdown().await;
    assert!(error.is_some(), "a client of the other file was served");
    assert_unique(&photos);
    assert_unique(&blocks);
}
