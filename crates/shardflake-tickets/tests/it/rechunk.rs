//! A reshape that keeps every offset and the increment (a new chunk only),
//! then one server given back its own dump of before it: the residue
//! classes keep their names, so only the lattice version tells the two
//! lattices apart. Clients of the old file and of the new one must both be
//! refused until the reshape is run again: the restored server's old
//! 100-wide blocks lie inside its peer's new 200-wide ones.

use std::path::{Path, PathBuf};

use shardflake_testkit::PgServer;
use shardflake_tickets::{Config, PeersStore, TicketClient, TicketError, admin};

use super::live_restore::{pg_dump, pg_pair, psql};
use super::repro::{dump, pair, restore};
use super::{assert_unique, init_ok, maria};

/// `n` ids of the segment sequence `blocks` from a client of `config`
/// run for this call alone, as `shardflake tickets next` does.
async fn blocks(config: &Config, n: usize) -> Result<Vec<u64>, TicketError> {
    let client = TicketClient::connect(config.clone()).await?;
    let ids = client.next_n("blocks", n).await;
    client.shutdown().await;
    ids
}

/// `old` with a chunk of 200 instead of 100: a reshape from one to the
/// other keeps every class's name.
fn rechunked(old: &Config) -> Config {
    let mut new = old.clone();
    new.segment.chunk = 200;
    new
}

/// The reviewer's reproduction: ids from `old`, `b` dumped, reshaped to
/// the new chunk, ids from the new file, `b` given back its dump; then a
/// client of each file. On the code before the fix both late clients were
/// served (the old one by `b`, the new one by `a`): 2000 of 12,000 ids
/// handed out twice on MariaDB.
async fn chunk_only_reshape_then_old_dump(
    old: &Config,
    dump_b: impl FnOnce() -> PathBuf,
    restore_b: impl FnOnce(&Path),
) {
    let new = rechunked(old);
    init_ok(old).await;
    let mut ids = blocks(old, 1000).await.unwrap();
    let night = dump_b();
    admin::reshape(&new, &PeersStore::new(new.clone()))
        .await
        .unwrap();
    ids.extend(blocks(&new, 1000).await.unwrap());
    restore_b(&night);
    let _ = std::fs::remove_file(&night);

    let late_old = blocks(old, 5000).await;
    let late_new = blocks(&new, 5000).await;
    for got in [&late_old, &late_new].into_iter().flatten() {
        ids.extend(got);
    }
    assert_unique(&ids);
    let old_said = late_old.expect_err("a client of the file of before the reshape");
    assert!(
        old_said.to_string().contains("lattice"),
        "old file: {old_said}"
    );
    late_new.expect_err("a client of the current file while b is back before the reshape");

    // The way out: the reshape again, with the current file.
    admin::reshape(&new, &PeersStore::new(new.clone()))
        .await
        .unwrap();
    ids.extend(blocks(&new, 3000).await.unwrap());
    assert_unique(&ids);
    assert!(blocks(old, 10).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chunk_only_reshape_then_a_servers_own_old_dump_hands_out_nothing_twice_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    chunk_only_reshape_then_old_dump(
        &pair(&a, &b, ""),
        || dump(&b, "before-rechunk"),
        |path| restore(&b, path),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chunk_only_reshape_then_a_servers_own_old_dump_hands_out_nothing_twice_postgres() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    chunk_only_reshape_then_old_dump(
        &pg_pair(&a, &b, "table"),
        || pg_dump(&b, "before-rechunk", &["--clean", "--if-exists"]),
        |path| psql(&b, &[], path),
    )
    .await;
}
