//! Nothing to link: the model check is `tests/it/main.rs`, built only with
//! `RUSTFLAGS="--cfg loom"` (see `scripts/test.sh`):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p shardflake-loom --release
//! ```
