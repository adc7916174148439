//! MariaDB shards with an owner (issue 37, B): the shard field is the key
//! (`user_id`) mod 2^shard_bits, not a server, so two servers inserting
//! rows of users whose ids are equal mod 1024 made identical ids (3,463 of
//! 46,448). Each server now records the shard values it makes ids for;
//! `apply` refuses values another server of the deployment records, and
//! the trigger and `generate_post_id` refuse a key outside them.

use mysql_async::{Conn, Opts};
use shardflake::preset;
use shardflake_db::mysql::{self, Options};
use shardflake_testkit::MariaDbServer;

async fn conn(url: &str) -> Conn {
    Conn::new(Opts::from_url(url).unwrap()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_never_make_ids_for_one_shard_value() {
    let (a, b) = (
        MariaDbServer::start_with("", None).unwrap(),
        MariaDbServer::start_with("", None).unwrap(),
    );
    let layout = preset::by_name("mysql-procedure").unwrap();
    let with = |shards: Option<(u64, u64)>, peers: &[&MariaDbServer]| Options {
        shards,
        peers: peers.iter().map(|s| s.url()).collect(),
        ..Options::default()
    };
    let (mut ca, mut cb) = (conn(&a.url()).await, conn(&b.url()).await);
    mysql::apply(&mut ca, &layout, &with(Some((0, 511)), &[]))
        .await
        .unwrap();
    // b may not take values a has, nor all of them (the default).
    for shards in [Some((500, 1023)), None] {
        let e = mysql::apply(&mut cb, &layout, &with(shards, &[&a]))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("shard values 0-511, which meets"), "{e}");
        assert!(e.contains("nothing was changed"), "{e}");
    }
    let installed: String = b
        .sql("SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = 'app'")
        .unwrap();
    assert_eq!(installed, "0", "a refused apply installs nothing");
    mysql::apply(&mut cb, &layout, &with(Some((512, 1023)), &[&a]))
        .await
        .unwrap();

    // Users 5 and 5 + 1024 share shard value 5: only a makes their ids.
    let names = Options::default().names;
    let id = mysql::insert(&mut ca, &names, 5, "x").await.unwrap();
    assert!(id > 0);
    let e = mysql::insert(&mut cb, &names, 5 + 1024, "x")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "shard value 5 (the key mod 1024) is not one this server makes ids for (512-1023)"
        ),
        "{e}"
    );
    let e = mysql::generate_post_id(&mut cb, "generate_post_id", 5)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("shard value 5"), "{e}");
    assert!(mysql::insert(&mut cb, &names, 600, "x").await.is_ok());
    assert!(
        mysql::generate_post_id(&mut cb, "generate_post_id", 600)
            .await
            .is_ok()
    );
    // The record holds: check and repair keep the range, apply without
    // --shards keeps it.
    let opts = Options::default();
    assert_eq!(
        mysql::check(&mut cb, &layout, &opts).await.unwrap(),
        Vec::<String>::new()
    );
    mysql::repair(&mut cb, &layout, &opts).await.unwrap();
    mysql::apply(&mut cb, &layout, &opts).await.unwrap();
    assert!(mysql::insert(&mut cb, &names, 5, "x").await.is_err());
    assert_eq!(
        mysql::check(&mut cb, &layout, &opts).await.unwrap(),
        Vec::<String>::new()
    );
    // A range outside the layout is refused.
    let e = mysql::apply(&mut ca, &layout, &with(Some((0, 1024)), &[]))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a range within 0-1023"), "{e}");
}
