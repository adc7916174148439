//! Ids made in the client, and the one ordering every kind is checked in.
//!
//! Every id maps to a `u128` [`key`] whose order is the database's order of
//! the column: `bigint` as a signed integer, `uuid`/`BINARY(16)`/`bytea`/
//! `BINARY(12)` byte by byte (PostgreSQL's `uuid` and MariaDB's binary
//! strings both compare as `memcmp`).

use std::time::{Duration, Instant};

use shardflake::objectid::ObjectIdGenerator;
use shardflake::{Generator, MonotonicClock, preset};
use uuid::Uuid;

use crate::error::CompareError;
use crate::scheme::Scheme;

/// A batch of ids, in the type its column stores.
#[derive(Debug, Clone)]
pub(crate) enum Ids {
    Int(Vec<i64>),
    Uuid(Vec<Uuid>),
    Bytes(Vec<Vec<u8>>),
}

impl Ids {
    pub(crate) fn keys(&self) -> Vec<u128> {
        match self {
            Ids::Int(v) => v.iter().map(|&i| int_key(i)).collect(),
            Ids::Uuid(v) => v.iter().map(|u| u.as_u128()).collect(),
            Ids::Bytes(v) => v.iter().map(|b| bytes_key(b)).collect(),
        }
    }
}

/// A `bigint`'s key: signed order.
pub(crate) fn int_key(i: i64) -> u128 {
    (i as u64 ^ (1 << 63)) as u128
}

/// A binary string's key (up to 16 bytes): byte order.
pub(crate) fn bytes_key(b: &[u8]) -> u128 {
    let mut k = [0u8; 16];
    let n = b.len().min(16);
    k[..n].copy_from_slice(&b[..n]);
    u128::from_be_bytes(k)
}

/// A generator the client runs: one per process, shared by its connections.
pub(crate) enum ClientIds {
    Snowflake(Box<Generator<MonotonicClock>>),
    UuidV4,
    UuidV7,
    ObjectId(ObjectIdGenerator),
}

impl ClientIds {
    /// The client-side generator of `scheme`, if it has one.
    pub(crate) fn of(scheme: Scheme) -> Result<Option<ClientIds>, CompareError> {
        let err = |e: &dyn std::fmt::Display| CompareError::Generate {
            scheme: scheme.name(),
            message: e.to_string(),
        };
        Ok(Some(match scheme {
            Scheme::Snowflake => {
                let layout = preset::by_name("snowflake").map_err(|e| err(&e))?;
                let generator = Generator::builder(layout)
                    .node("node", 1)
                    .build()
                    .map_err(|e| err(&e))?;
                ClientIds::Snowflake(Box::new(generator))
            }
            Scheme::UuidV4 => ClientIds::UuidV4,
            Scheme::UuidV7 => ClientIds::UuidV7,
            Scheme::ObjectId => ClientIds::ObjectId(ObjectIdGenerator::new()),
            _ => return Ok(None),
        }))
    }

    /// The next `n` ids.
    pub(crate) fn take(&self, scheme: Scheme, n: usize) -> Result<Ids, CompareError> {
        let err = |e: shardflake::GenerateError| CompareError::Generate {
            scheme: scheme.name(),
            message: e.to_string(),
        };
        Ok(match self {
            ClientIds::Snowflake(g) => Ids::Int(
                (0..n)
                    .map(|_| g.next_id().map(|id| id.get() as i64))
                    .collect::<Result<_, _>>()
                    .map_err(err)?,
            ),
            ClientIds::UuidV4 => Ids::Uuid((0..n).map(|_| Uuid::new_v4()).collect()),
            ClientIds::UuidV7 => Ids::Uuid((0..n).map(|_| Uuid::now_v7()).collect()),
            ClientIds::ObjectId(g) => Ids::Bytes(
                (0..n)
                    .map(|_| g.next_id().map(|o| <[u8; 12]>::from(o).to_vec()))
                    .collect::<Result<_, _>>()
                    .map_err(err)?,
            ),
        })
    }

    /// Ids per second on one thread, over `within` (a Snowflake generator
    /// waits at its layout's 4,096 per millisecond).
    pub(crate) fn rate(&self, scheme: Scheme, within: Duration) -> Result<f64, CompareError> {
        let start = Instant::now();
        let mut made = 0u64;
        while start.elapsed() < within {
            std::hint::black_box(self.take(scheme, 1024)?);
            made += 1024;
        }
        Ok(made as f64 / start.elapsed().as_secs_f64().max(1e-9))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_like_the_columns() {
        assert!(int_key(-1) < int_key(0));
        assert!(int_key(0) < int_key(1));
        assert!(int_key(i64::MIN) < int_key(i64::MAX));
        assert!(bytes_key(&[0, 1]) < bytes_key(&[1, 0]));
        let a = Uuid::from_u128(1);
        let b = Uuid::from_u128(1 << 100);
        assert!(Ids::Uuid(vec![a]).keys()[0] < Ids::Uuid(vec![b]).keys()[0]);
    }

    #[test]
    fn client_ids_come_in_order_where_the_scheme_promises_it() {
        // (ObjectId's counter starts at random and may wrap within a second.)
        for scheme in [Scheme::Snowflake, Scheme::UuidV7] {
            let ids = ClientIds::of(scheme).unwrap().unwrap();
            let keys = ids.take(scheme, 5000).unwrap().keys();
            assert!(keys.windows(2).all(|w| w[0] < w[1]), "{scheme:?}");
        }
        assert!(ClientIds::of(Scheme::Bigserial).unwrap().is_none());
    }
}
