//! The id schemes compared, with what is known of each before measuring
//! (size, who makes the id, what it needs to coordinate). Everything else in
//! a [`crate::SchemeResult`] is measured.

use serde::Serialize;

/// Which server a comparison runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerKind {
    /// PostgreSQL (13 or later: `gen_random_uuid()`).
    Postgres,
    /// MariaDB or MySQL.
    Mariadb,
}

impl ServerKind {
    /// The name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            ServerKind::Postgres => "PostgreSQL",
            ServerKind::Mariadb => "MariaDB",
        }
    }
}

/// Who makes the id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MadeBy {
    /// The database, inside the `INSERT` (a default, a trigger).
    Database,
    /// A stored procedure called before the `INSERT` (one more round trip).
    Procedure,
    /// The application, with no round trip.
    Client,
    /// A ticket server (here: the same server), one round trip per id.
    TicketServer,
    /// A segment (block) from a ticket server, one round trip per block.
    Segment,
}

/// One way to make primary keys (serialised as its [`Scheme::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scheme {
    /// PostgreSQL `bigserial`: the baseline there.
    Bigserial,
    /// Our per-shard `next_id()` (Instagram's layout, one logical shard), as
    /// `pg apply` installs it.
    NextId,
    /// MariaDB `AUTO_INCREMENT`: the baseline there.
    AutoIncrement,
    /// Our one-statement ids: sequence + trigger + clock event, as `mysql
    /// apply` installs them.
    Trigger,
    /// Our `generate_post_id` procedure (draws from the same sequence).
    Procedure,
    /// The seed's `generate_post_id`, verbatim: its duplicates are the
    /// documents' trap, shown, not a failure.
    SeedProcedure,
    /// The server's own UUIDs: `gen_random_uuid()` (v4) on PostgreSQL,
    /// `UUID()` (v1) in `BINARY(16)` on MariaDB/MySQL.
    ServerUuid,
    /// Snowflake ids made by the library in the client.
    Snowflake,
    /// UUIDv4 made in the client.
    UuidV4,
    /// UUIDv7 made in the client.
    UuidV7,
    /// MongoDB ObjectId made in the client.
    #[serde(rename = "objectid")]
    ObjectId,
    /// Flickr-style ticket: one round trip per id (`nextval` on PostgreSQL,
    /// `REPLACE INTO` on MariaDB).
    Tickets,
    /// Leaf-style segment: a block of ids per round trip.
    Segment,
}

impl Scheme {
    /// Every scheme that fits the server, the baseline first.
    pub fn for_server(kind: ServerKind) -> &'static [Scheme] {
        use Scheme::*;
        match kind {
            ServerKind::Postgres => &[
                Bigserial, NextId, Snowflake, ServerUuid, UuidV4, UuidV7, ObjectId, Tickets,
                Segment,
            ],
            ServerKind::Mariadb => &[
                AutoIncrement,
                Trigger,
                Procedure,
                SeedProcedure,
                Snowflake,
                ServerUuid,
                UuidV4,
                UuidV7,
                ObjectId,
                Tickets,
                Segment,
            ],
        }
    }

    /// Short stable name (JSON, table names).
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Bigserial => "bigserial",
            Scheme::NextId => "next_id",
            Scheme::AutoIncrement => "auto_increment",
            Scheme::Trigger => "trigger",
            Scheme::Procedure => "procedure",
            Scheme::SeedProcedure => "seed_procedure",
            Scheme::ServerUuid => "server_uuid",
            Scheme::Snowflake => "snowflake",
            Scheme::UuidV4 => "uuid_v4",
            Scheme::UuidV7 => "uuid_v7",
            Scheme::ObjectId => "objectid",
            Scheme::Tickets => "tickets",
            Scheme::Segment => "segment",
        }
    }

    /// What a reader sees in the table.
    pub fn label(self, kind: ServerKind) -> &'static str {
        match (self, kind) {
            (Scheme::Bigserial, _) => "bigserial",
            (Scheme::NextId, _) => "shardflake next_id() (Instagram layout)",
            (Scheme::AutoIncrement, _) => "AUTO_INCREMENT",
            (Scheme::Trigger, _) => "shardflake sequence + trigger",
            (Scheme::Procedure, _) => "shardflake generate_post_id + INSERT",
            (Scheme::SeedProcedure, _) => "seed's generate_post_id + INSERT",
            (Scheme::ServerUuid, ServerKind::Postgres) => "gen_random_uuid() (v4, server)",
            (Scheme::ServerUuid, ServerKind::Mariadb) => "UUID() (v1, server) in BINARY(16)",
            (Scheme::Snowflake, _) => "Snowflake (library, client)",
            (Scheme::UuidV4, _) => "UUIDv4 (client)",
            (Scheme::UuidV7, _) => "UUIDv7 (client)",
            (Scheme::ObjectId, _) => "ObjectId (client)",
            (Scheme::Tickets, ServerKind::Postgres) => "ticket per id (nextval)",
            (Scheme::Tickets, ServerKind::Mariadb) => "ticket per id (REPLACE INTO)",
            (Scheme::Segment, _) => "segment (blocks of ids)",
        }
    }

    /// Bytes of the key.
    pub fn bytes(self) -> u32 {
        match self {
            Scheme::ServerUuid | Scheme::UuidV4 | Scheme::UuidV7 => 16,
            Scheme::ObjectId => 12,
            _ => 8,
        }
    }

    /// Who makes the id.
    pub fn made_by(self) -> MadeBy {
        match self {
            Scheme::Bigserial
            | Scheme::NextId
            | Scheme::AutoIncrement
            | Scheme::Trigger
            | Scheme::ServerUuid => MadeBy::Database,
            Scheme::Procedure | Scheme::SeedProcedure => MadeBy::Procedure,
            Scheme::Snowflake | Scheme::UuidV4 | Scheme::UuidV7 | Scheme::ObjectId => {
                MadeBy::Client
            }
            Scheme::Tickets => MadeBy::TicketServer,
            Scheme::Segment => MadeBy::Segment,
        }
    }

    /// What it takes to keep ids unique once data spans servers.
    pub fn coordination(self) -> &'static str {
        match self {
            Scheme::Bigserial | Scheme::AutoIncrement => {
                "one server: the table's counter (unique on that server only)"
            }
            Scheme::NextId | Scheme::Trigger | Scheme::Procedure => {
                "a shard id per logical shard (the topology); none per insert"
            }
            Scheme::SeedProcedure => "a shard id per server; racy: repeats under concurrency",
            Scheme::ServerUuid => "none (v4: 122 random bits; v1: time and the host's node)",
            Scheme::UuidV4 => "none (122 random bits)",
            Scheme::UuidV7 => "none (ms time + 74 random bits)",
            Scheme::Snowflake => "a node id per process (static or leased from etcd)",
            Scheme::ObjectId => "none (40 random bits per process)",
            Scheme::Tickets => "a ticket server pair; a round trip per id",
            Scheme::Segment => "a ticket server pair; a round trip per block",
        }
    }

    /// The server's own counter, which the others are measured against.
    pub fn is_baseline(self) -> bool {
        matches!(self, Scheme::Bigserial | Scheme::AutoIncrement)
    }

    /// Duplicates are the point (the documents' trap), not a failure.
    pub fn duplicates_expected(self) -> bool {
        self == Scheme::SeedProcedure
    }
}

impl Scheme {
    /// Every scheme, in report order.
    pub const ALL: [Scheme; 13] = [
        Scheme::Bigserial,
        Scheme::AutoIncrement,
        Scheme::NextId,
        Scheme::Trigger,
        Scheme::Procedure,
        Scheme::SeedProcedure,
        Scheme::Snowflake,
        Scheme::ServerUuid,
        Scheme::UuidV4,
        Scheme::UuidV7,
        Scheme::ObjectId,
        Scheme::Tickets,
        Scheme::Segment,
    ];

    /// The scheme of a [`Scheme::name`].
    pub fn from_name(name: &str) -> Option<Scheme> {
        Scheme::ALL.into_iter().find(|s| s.name() == name)
    }
}
