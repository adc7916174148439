//! [`Id`] in `sqlx` (feature `sqlx`): `Type`, `Encode` and `Decode` for
//! PostgreSQL and MySQL/MariaDB.
//!
//! - **PostgreSQL** `bigint`: bit for bit, as the signed number holding the
//!   same 64 bits ([`Id::to_i64_wrapping`]), the same as the `postgres`
//!   feature: ids that use the top bit (Instagram's layout from 2046) are
//!   stored negative and read back unchanged.
//! - **MySQL/MariaDB** `BIGINT UNSIGNED` or `BIGINT`: an id is sent as the
//!   unsigned number it is, so it fits a `BIGINT UNSIGNED` column whatever
//!   its top bit (Flickr's `Tickets64` is one), and a signed `BIGINT` column
//!   for every layout with a sign bit; the server refuses an id above
//!   `i64::MAX` for a signed column rather than store it negative. A signed
//!   column's value is read bit for bit.
//!
//! ```no_run
//! # async fn f(pool: &sqlx::PgPool, id: shardflake::Id) -> Result<(), sqlx::Error> {
//! let back: shardflake::Id = sqlx::query_scalar("INSERT INTO posts (id) VALUES ($1) RETURNING id")
//!     .bind(id)
//!     .fetch_one(pool)
//!     .await?;
//! assert_eq!(back, id);
//! # Ok(()) }
//! ```

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::mysql::{MySql, MySqlTypeInfo, MySqlValueRef};
use sqlx::postgres::{PgArgumentBuffer, PgHasArrayType, PgTypeInfo, PgValueRef, Postgres};
use sqlx::{Decode, Encode, Type, ValueRef};

use crate::Id;

impl Type<Postgres> for Id {
    fn type_info() -> PgTypeInfo {
        <i64 as Type<Postgres>>::type_info()
    }
}

impl PgHasArrayType for Id {
    fn array_type_info() -> PgTypeInfo {
        <i64 as PgHasArrayType>::array_type_info()
    }
}

impl Encode<'_, Postgres> for Id {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <i64 as Encode<Postgres>>::encode_by_ref(&self.to_i64_wrapping(), buf)
    }
}

impl<'r> Decode<'r, Postgres> for Id {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        Ok(Id::from_i64_wrapping(<i64 as Decode<Postgres>>::decode(
            value,
        )?))
    }
}

impl Type<MySql> for Id {
    fn type_info() -> MySqlTypeInfo {
        <u64 as Type<MySql>>::type_info()
    }

    fn compatible(ty: &MySqlTypeInfo) -> bool {
        <u64 as Type<MySql>>::compatible(ty) || <i64 as Type<MySql>>::compatible(ty)
    }
}

impl Encode<'_, MySql> for Id {
    fn encode_by_ref(&self, buf: &mut Vec<u8>) -> Result<IsNull, BoxDynError> {
        <u64 as Encode<MySql>>::encode_by_ref(&self.get(), buf)
    }
}

impl<'r> Decode<'r, MySql> for Id {
    fn decode(value: MySqlValueRef<'r>) -> Result<Self, BoxDynError> {
        if <u64 as Type<MySql>>::compatible(&value.type_info()) {
            Ok(Id(<u64 as Decode<MySql>>::decode(value)?))
        } else {
            Ok(Id::from_i64_wrapping(<i64 as Decode<MySql>>::decode(
                value,
            )?))
        }
    }
}
