//! `shardflake-db`'s integration tests, one binary: each module starts its
//! own PostgreSQL or MariaDB servers through `shardflake-testkit`.

mod id_types;
mod mysql;
mod mysql_adopt;
mod mysql_binlog;
mod mysql_failover;
mod mysql_operator;
mod mysql_shards;
mod pg;
mod pg_adopt;
mod pg_dead_ends;
mod pg_deployment_lock;
mod pg_durability;
mod pg_failover;
mod pg_identity;
mod pg_move;
mod pg_next_id;
mod pg_operator;
mod pg_physical;
mod pg_replace;
mod pg_stopped;
mod time_range;
