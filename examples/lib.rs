//! Runnable examples of the `shardflake` library (this package only holds
//! them; it is not published):
//!
//! - `axum_handler`: ids in an axum handler, one lock-free `Generator`
//!   shared by every request.
//! - `sqlx_insert`: `INSERT … RETURNING` with an application-made id
//!   through sqlx, on PostgreSQL or MariaDB (feature `sqlx` of `shardflake`).
//! - `decode_log`: the ids in log lines, decoded to their time and fields.
//!
//! ```text
//! cargo run -p shardflake-examples --example axum_handler
//! DATABASE_URL=postgres://… cargo run -p shardflake-examples --example sqlx_insert
//! cargo run -p shardflake-examples --example decode_log -- snowflake < app.log
//! ```
