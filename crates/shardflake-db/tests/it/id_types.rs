//! `shardflake::Id` as a column type on real servers: the `postgres`
//! feature (tokio-postgres) and the `sqlx` feature (PostgreSQL and MariaDB),
//! with the edge cases of a signed `BIGINT`: 0, `i64::MAX`, ids with the
//! top bit set (Instagram's layout from 2046), and `u64::MAX`.

use shardflake::Id;
use shardflake_testkit::{MariaDbServer, PgServer};

/// The values that matter for a 64-bit id in a signed or unsigned column.
const EDGES: [u64; 6] = [
    0,
    1,
    454_947_766_275_222_906,
    i64::MAX as u64,
    1 << 63,
    u64::MAX,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_bigint_round_trips_every_id() -> anyhow::Result<()> {
    let pg = PgServer::start()?;
    let (client, conn) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    client
        .batch_execute("CREATE TABLE ids (id bigint PRIMARY KEY)")
        .await?;
    for v in EDGES {
        let id = Id(v);
        let row = client
            .query_one(
                "INSERT INTO ids (id) VALUES ($1) RETURNING id, id::text",
                &[&id],
            )
            .await?;
        let back: Id = row.get(0);
        assert_eq!(back, id);
        // Stored bit for bit: the top bit makes it negative in SQL.
        let text: String = row.get(1);
        assert_eq!(text, id.to_i64_wrapping().to_string());
    }
    // Not a bigint: a typed error, not a panic or a wrong value.
    let row = client.query_one("SELECT 5::int4", &[]).await?;
    assert!(row.try_get::<_, Id>(0).is_err());

    // sqlx on the same server.
    let pool = sqlx::PgPool::connect(&pg.url()).await?;
    for v in EDGES {
        let id = Id(v);
        let back: Id = sqlx::query_scalar("SELECT $1::bigint")
            .bind(id)
            .fetch_one(&pool)
            .await?;
        assert_eq!(back, id);
        let stored: i64 = sqlx::query_scalar("SELECT id FROM ids WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await?;
        assert_eq!(stored, id.to_i64_wrapping());
    }
    let ids: Vec<Id> = sqlx::query_scalar("SELECT array_agg(id ORDER BY id) FROM ids")
        .fetch_one(&pool)
        .await?;
    assert_eq!(ids.len(), EDGES.len());
    let err = sqlx::query_scalar::<_, Id>("SELECT 'x'::text")
        .fetch_one(&pool)
        .await;
    assert!(err.is_err(), "a text column is not an id");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_bigint_and_unsigned_round_trip_with_sqlx() -> anyhow::Result<()> {
    let db = MariaDbServer::start()?;
    let pool = sqlx::MySqlPool::connect(&db.url()).await?;
    sqlx::query("CREATE TABLE u (id BIGINT UNSIGNED PRIMARY KEY)")
        .execute(&pool)
        .await?;
    sqlx::query("CREATE TABLE s (id BIGINT PRIMARY KEY)")
        .execute(&pool)
        .await?;
    for v in EDGES {
        let id = Id(v);
        // An unsigned column holds every id as the number it is.
        let back: Id = sqlx::query_scalar("INSERT INTO u (id) VALUES (?) RETURNING id")
            .bind(id)
            .fetch_one(&pool)
            .await?;
        assert_eq!(back, id);
        let plain: u64 = sqlx::query_scalar("SELECT id FROM u WHERE id = ?")
            .bind(id)
            .fetch_one(&pool)
            .await?;
        assert_eq!(plain, v);
        // A signed column holds ids up to i64::MAX; above, the server refuses
        // (no silent negative).
        let signed = sqlx::query_scalar::<_, Id>("INSERT INTO s (id) VALUES (?) RETURNING id")
            .bind(id)
            .fetch_one(&pool)
            .await;
        if v <= i64::MAX as u64 {
            assert_eq!(signed?, id);
        } else {
            assert!(signed.is_err(), "{v} stored in a signed BIGINT");
        }
    }
    // A negative value already in a signed column reads back bit for bit.
    sqlx::query("INSERT INTO s (id) VALUES (-1)")
        .execute(&pool)
        .await?;
    let back: Id = sqlx::query_scalar("SELECT id FROM s WHERE id = -1")
        .fetch_one(&pool)
        .await?;
    assert_eq!(back, Id(u64::MAX));
    Ok(())
}
