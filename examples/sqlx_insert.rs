//! `INSERT … RETURNING` with an id made in the application, through sqlx
//! (feature `sqlx`), on PostgreSQL or MariaDB ≥ 10.5.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!     cargo run -p shardflake-examples --example sqlx_insert
//! DATABASE_URL=mysql://root@127.0.0.1:3306/test \
//!     cargo run -p shardflake-examples --example sqlx_insert
//! ```
//!
//! The id is bound like any integer and read back as an [`Id`]; it decodes
//! to its node and time without asking the database.

use shardflake::{Generator, Id, preset};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .map_err(|_| "set DATABASE_URL to a postgres:// or mysql:// URL")?;
    let layout = preset::by_name("snowflake")?;
    let ids = Generator::builder(layout.clone()).node("node", 3).build()?;
    let id = ids.next_id()?;

    let back: Id = if url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(&url).await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS example_posts (id bigint PRIMARY KEY, body text)")
            .execute(&pool)
            .await?;
        sqlx::query_scalar("INSERT INTO example_posts (id, body) VALUES ($1, $2) RETURNING id")
            .bind(id)
            .bind("hello")
            .fetch_one(&pool)
            .await?
    } else {
        let pool = sqlx::MySqlPool::connect(&url).await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS example_posts (id BIGINT UNSIGNED PRIMARY KEY, body TEXT)",
        )
        .execute(&pool)
        .await?;
        sqlx::query_scalar("INSERT INTO example_posts (id, body) VALUES (?, ?) RETURNING id")
            .bind(id)
            .bind("hello")
            .fetch_one(&pool)
            .await?
    };
    assert_eq!(back, id);
    let parts = back.decode(&layout)?;
    println!(
        "inserted {back}: node {:?}, made at {}",
        parts.field("node"),
        parts.timestamp()
    );
    Ok(())
}
