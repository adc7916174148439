//! The MariaDB procedure against a real server started by the test.

use std::collections::HashSet;
use std::time::{SystemTime, UNIX_EPOCH};

use shardflake::{Id, preset};
use shardflake_db::mysql::{self, Flavor};
use shardflake_db::testing::MariaDbServer;

async fn ids_from(
    pool: &mysql_async::Pool,
    flavor: Flavor,
    clients: usize,
    calls: usize,
    user_id: i64,
) -> Vec<i64> {
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = pool.get_conn().await.unwrap();
            let mut ids = Vec::with_capacity(calls);
            for _ in 0..calls {
                ids.push(
                    mysql::generate_post_id(&mut c, flavor, user_id)
                        .await
                        .unwrap(),
                );
            }
            ids
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seed_procedure_repeats_ids_under_concurrency_ours_does_not() {
    let server = MariaDbServer::start().unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let mut c = pool.get_conn().await.unwrap();
    mysql::install(&mut c, &layout, Flavor::Seed).await.unwrap();
    mysql::install(&mut c, &layout, Flavor::Ours).await.unwrap();
    // Re-installing is harmless.
    mysql::install(&mut c, &layout, Flavor::Ours).await.unwrap();

    // One call, decoded in Rust: the seed's test (user 1801).
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let id = mysql::generate_post_id(&mut c, Flavor::Ours, 1801)
        .await
        .unwrap();
    let after = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let parts = Id(id as u64).decode(&layout).unwrap();
    assert_eq!(parts.field("shard"), Some(1801 % 1024));
    assert!(
        parts.unix_ms + 2 >= before && parts.unix_ms <= after + 1,
        "{} [{before}, {after}]",
        parts.unix_ms
    );
    let e = mysql::generate_post_id(&mut c, Flavor::Ours, -1)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("user_id must be >= 0"), "{e}");
    drop(c);

    // 16 callers sharing one user id, as the seed's ORM generator would call it.
    let seed = ids_from(&pool, Flavor::Seed, 16, 300, 1801).await;
    let seed_unique: HashSet<i64> = seed.iter().copied().collect();
    assert!(
        seed_unique.len() < seed.len(),
        "the seed's procedure handed out {} ids, all distinct: expected duplicates",
        seed.len()
    );
    let ours = ids_from(&pool, Flavor::Ours, 16, 300, 1801).await;
    let ours_unique: HashSet<i64> = ours.iter().copied().collect();
    assert_eq!(
        ours_unique.len(),
        ours.len(),
        "our procedure repeated an id"
    );
    for id in &ours {
        assert_eq!(
            Id(*id as u64).decode(&layout).unwrap().field("shard"),
            Some(1801 % 1024)
        );
    }
    eprintln!(
        "seed: {} of {} ids duplicated; ours: 0 of {}",
        seed.len() - seed_unique.len(),
        seed.len(),
        ours.len()
    );

    // The benchmark driver runs end to end (tiny).
    let results = mysql::bench(&pool, &layout, 4, 50, 1801).await.unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(results[0].duplicates, 0);
    assert_eq!(results[2].duplicates, 0);
    pool.disconnect().await.unwrap();
}
