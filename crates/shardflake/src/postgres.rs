//! [`Id`] as a PostgreSQL `bigint` through `postgres-types` (feature
//! `postgres`): usable with `tokio-postgres` and `postgres` as a query
//! parameter and a column value.
//!
//! PostgreSQL has no unsigned 64-bit type, so an id travels bit for bit as
//! the signed `bigint` holding the same 64 bits
//! ([`Id::to_i64_wrapping`]): ids of layouts with a sign bit (Snowflake,
//! the MySQL procedure's) are stored as the same positive number; ids of
//! layouts that use all 64 bits (Instagram's, from 2046-06-27 for its
//! epoch) are stored as negative numbers and read back as the same [`Id`].
//! Order in SQL then follows the signed value; see the layout's
//! `negative_from` in `shardflake plan`.
//!
//! With `tokio-postgres`, bind an id as a parameter and read it from a row:
//! `client.execute("INSERT INTO posts (id) VALUES ($1)", &[&id])`,
//! `let id: Id = row.get("id")`. Underneath:
//!
//! ```
//! use postgres_types::{FromSql, ToSql, Type};
//! use shardflake::Id;
//!
//! let id = Id(1 << 63); // the top bit set: a negative bigint
//! let mut wire = bytes::BytesMut::new();
//! id.to_sql(&Type::INT8, &mut wire)?;
//! assert_eq!(i64::from_sql(&Type::INT8, &wire)?, i64::MIN);
//! assert_eq!(Id::from_sql(&Type::INT8, &wire)?, id);
//! assert!(!<Id as ToSql>::accepts(&Type::TEXT));
//! # Ok::<(), Box<dyn std::error::Error + Sync + Send>>(())
//! ```

use bytes::BytesMut;
use postgres_types::{FromSql, IsNull, ToSql, Type, accepts, to_sql_checked};

use crate::Id;

type BoxError = Box<dyn std::error::Error + Sync + Send>;

impl<'a> FromSql<'a> for Id {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        Ok(Id::from_i64_wrapping(i64::from_sql(ty, raw)?))
    }

    accepts!(INT8);
}

impl ToSql for Id {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        self.to_i64_wrapping().to_sql(ty, out)
    }

    accepts!(INT8);

    to_sql_checked!();
}
