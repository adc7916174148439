//! One PostgreSQL session of a ticket server: a sequence per ticket
//! sequence (`INCREMENT BY n START WITH k NO CYCLE`, the default) or
//! Flickr's table (`INSERT … ON CONFLICT … RETURNING`), the segment rows
//! and the high-water table, over tokio-postgres.
//!
//! Statements are prepared once per connection, so each call is one round
//! trip (Bind/Execute/Sync). A sequence's increment and residue live in the
//! schema, not the session: every connect reads them back and refuses a
//! sequence whose increment, start residue or maximum differ from the file.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls, Statement};

use super::{
    Backend, GUARD, GUARD_MISSING, HOLDERS_TABLE, HW_TABLE, Holder, LATTICE_TABLE, LatticeRecord,
    LatticeVersion, MARKS_AT_TABLE, MarkFence, SEGMENT_TABLE, SequenceState, ServerIdentity,
    ServerSettings, Stamped, VERSION_TABLE, clean_identity, guard_refusal, guarded_tables,
    holder_fence, holder_of, lattice_moved, mode_changed, not_initialised, raise_segment_sql,
    unguarded,
};
use crate::config::{
    Config, Kind, Mode, PgTickets, SequenceConfig, ServerConfig, first_of_residue,
};
use crate::error::TicketError;
use crate::segment::Lattice;

/// A connected session with its statements prepared.
pub(crate) struct PgSession {
    server: String,
    client: Client,
    /// The per-id statement of each sequence (`None` for segment sequences).
    next: Vec<Option<Statement>>,
    reserve: Option<Statement>,
    /// The lattice version this session is pinned to: every ticket's and
    /// block's statement answers only while the server's is this one.
    lattice: Option<i64>,
}

fn pg_err(server: &str, context: &str) -> impl FnOnce(tokio_postgres::Error) -> TicketError {
    move |e| {
        let message = match e.as_db_error() {
            Some(db) => format!("{} ({})", db.message(), db.code().code()),
            None => e.to_string(),
        };
        TicketError::db(server, context, message)
    }
}

fn is_full(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::SEQUENCE_GENERATOR_LIMIT_EXCEEDED
            || *c == SqlState::CHECK_VIOLATION
            || *c == SqlState::NUMERIC_VALUE_OUT_OF_RANGE
    )
}

/// The first id of a per-id sequence on a server.
fn first_id(config: &Config, server: &ServerConfig, seq: &SequenceConfig) -> u64 {
    first_of_residue(seq.start, server.offset, config.increment)
}

impl PgSession {
    /// Connects, with lock waits and statements bounded by the server too
    /// (`admin_timeout_ms`): nothing verified or prepared yet (admin work
    /// needs no more; the client then calls [`PgSession::prepare`]).
    pub async fn connect(server: &ServerConfig, config: &Config) -> Result<Self, TicketError> {
        let name = &server.name;
        let mut pg: tokio_postgres::Config = server
            .url
            .parse()
            .map_err(|e| TicketError::misconfigured(name, format!("bad url: {e}")))?;
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(Duration::from_secs(5));
        }
        pg.application_name("shardflake-tickets");
        let (client, connection) = pg.connect(NoTls).await.map_err(pg_err(name, "connect"))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "ticket server connection ended");
            }
        });
        let limit = config.failover.admin_timeout().as_millis();
        client
            .batch_execute(&format!(
                "SET lock_timeout = {limit}; SET statement_timeout = {limit}"
            ))
            .await
            .map_err(pg_err(name, "SET lock_timeout, statement_timeout"))?;
        Ok(PgSession {
            server: name.clone(),
            client,
            next: Vec::new(),
            reserve: None,
            lattice: None,
        })
    }

    async fn verify_sequence(
        &self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
    ) -> Result<(), TicketError> {
        let row = self
            .client
            .query_opt(
                "SELECT increment_by, start_value, max_value FROM pg_sequences WHERE schemaname = current_schema() AND sequencename = $1",
                &[&seq.table()],
            )
            .await
            .map_err(pg_err(&self.server, "read the sequence"))?
            .ok_or_else(|| {
                TicketError::misconfigured(
                    &self.server,
                    format!("sequence {} is missing (run `shardflake tickets init`)", seq.table()),
                )
            })?;
        let (increment, start, max): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        let n = config.increment as i64;
        if increment != n
            || start.rem_euclid(n) != (server.offset as i64) % n
            || max as u64 != seq.max_id()
        {
            return Err(TicketError::misconfigured(
                &self.server,
                format!(
                    "sequence {} has INCREMENT {increment} START {start} MAXVALUE {max}; the file wants INCREMENT {n}, a start ≡ {} (mod {n}), MAXVALUE {}",
                    seq.table(),
                    server.offset,
                    seq.max_id()
                ),
            ));
        }
        Ok(())
    }

    /// Whether `seq`'s per-id relation exists as the style the file names.
    /// The other kind there (a sequence where the file says table, as on a
    /// server set up when the sequence was the default) is refused with
    /// the setting that matches it.
    async fn per_id_exists(
        &self,
        config: &Config,
        seq: &SequenceConfig,
    ) -> Result<bool, TicketError> {
        let row = self
            .client
            .query_one(
                "SELECT (SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1))",
                &[&seq.table()],
            )
            .await
            .map_err(pg_err(&self.server, "look up a relation"))?;
        let kind: Option<String> = row.get(0);
        let (want, there) = match config.postgres_tickets {
            PgTickets::Sequence => ("S", "table"),
            PgTickets::Table => ("r", "sequence"),
        };
        match kind.as_deref() {
            None => Ok(false),
            Some(k) if k == want => Ok(true),
            Some(_) => Err(TicketError::misconfigured(
                &self.server,
                format!(
                    "{} is a {there} here, but the file says postgres_tickets = \"{}\" (the table is the default): put postgres_tickets = \"{there}\" in the file",
                    seq.table(),
                    if there == "table" {
                        "sequence"
                    } else {
                        "table"
                    }
                ),
            )),
        }
    }

    async fn relation_exists(&self, name: &str) -> Result<bool, TicketError> {
        let row = self
            .client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
            .await
            .map_err(pg_err(&self.server, "look up a relation"))?;
        Ok(row.get(0))
    }
}

impl Backend for PgSession {
    /// Verifies every per-id sequence's increment and residue, and prepares
    /// the statements.
    async fn prepare(&mut self, server: &ServerConfig, config: &Config) -> Result<(), TicketError> {
        let name = &server.name;
        let version = self.lattice.ok_or_else(|| {
            TicketError::misconfigured(name, "a session prepared before its lattice was checked")
        })?;
        // Every ticket and block only while the server's lattice version is
        // this session's: no row, no id (see `VERSION_TABLE`).
        let pinned = format!("FROM {VERSION_TABLE} WHERE version = {version}");
        let session = self;
        for seq in &config.sequences {
            let statement = match seq.mode {
                Mode::Segment => None,
                Mode::PerId => {
                    session.per_id_exists(config, seq).await?;
                    let sql = match config.postgres_tickets {
                        PgTickets::Sequence => {
                            session.verify_sequence(config, server, seq).await?;
                            // The sequence's file node, its oid resolved
                            // again when a restore recreates it (the plan
                            // depends on it).
                            format!(
                                "SELECT nextval('{t}'), pg_relation_filenode('{t}'::regclass)::bigint {pinned}",
                                t = seq.table()
                            )
                        }
                        PgTickets::Table => format!(
                            "INSERT INTO {t} AS t (stub, id) SELECT 'a', {first} {pinned} ON CONFLICT (stub) DO UPDATE SET id = t.id + {n} RETURNING id, pg_relation_filenode(tableoid)::bigint",
                            t = seq.table(),
                            first = first_id(config, server, seq),
                            n = config.increment
                        ),
                    };
                    Some(
                        session
                            .client
                            .prepare(&sql)
                            .await
                            .map_err(pg_err(name, "prepare (run `shardflake tickets init`?)"))?,
                    )
                }
            };
            session.next.push(statement);
        }
        if config.sequences.iter().any(|q| q.mode == Mode::Segment) {
            session.reserve = Some(
                session
                    .client
                    .prepare(&format!(
                        "UPDATE {SEGMENT_TABLE} SET max_id = GREATEST(max_id, $1) + $2 WHERE sequence_name = $3 AND max_id >= $4 AND (SELECT version FROM {VERSION_TABLE}) = {version} RETURNING max_id, pg_relation_filenode(tableoid)::bigint, EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = {SEGMENT_TABLE}.tableoid AND g.tgname = '{GUARD}' AND g.tgenabled <> 'D')"
                    ))
                    .await
                    .map_err(pg_err(name, "prepare (run `shardflake tickets init`?)"))?,
            );
        }
        Ok(())
    }

    /// One per-id ticket, with its sequence's (or table's) file node.
    async fn next_ticket(
        &mut self,
        index: usize,
        seq: &SequenceConfig,
    ) -> Result<Stamped<u64>, TicketError> {
        let statement = self.next[index]
            .as_ref()
            .ok_or_else(|| TicketError::misconfigured(&self.server, "not a per-id sequence"))?;
        match self.client.query_opt(statement, &[]).await {
            Ok(Some(row)) => Ok(Stamped {
                value: row.get::<_, i64>(0) as u64,
                table: Some(row.get(1)),
            }),
            // The server's lattice version is not this session's.
            Ok(None) => Err(lattice_moved(&self.server, &seq.name)),
            Err(e) if is_full(&e) => Err(TicketError::Exhausted {
                sequence: seq.name.clone(),
                max: seq.max_id(),
            }),
            Err(e) => Err(pg_err(&self.server, "next ticket")(e)),
        }
    }

    /// The file node of what sequence `seq` counts with: its sequence or
    /// table (per id), or the segment table (see [`Stamped`]).
    async fn identity(&mut self, seq: &SequenceConfig) -> Result<Option<i64>, TicketError> {
        let name = match seq.mode {
            Mode::PerId => seq.table(),
            Mode::Segment => SEGMENT_TABLE.to_string(),
        };
        let row = self
            .client
            .query_one(
                "SELECT pg_relation_filenode(to_regclass($1))::bigint",
                &[&name],
            )
            .await
            .map_err(pg_err(&self.server, "read the file node"))?;
        Ok(row.get(0))
    }

    /// Reserves a block: `max_id = GREATEST(max_id, floor) + step RETURNING
    /// max_id`, the table's file node and whether its guard is there and
    /// enabled, only where the row is at or above `seen`: `Err(row)` when
    /// it is below (the server went back).
    async fn reserve(
        &mut self,
        seq: &SequenceConfig,
        floor: i64,
        step: i64,
        seen: i64,
    ) -> Result<Stamped<Result<i64, i64>>, TicketError> {
        let statement = self
            .reserve
            .as_ref()
            .ok_or_else(|| TicketError::misconfigured(&self.server, "no segment sequence"))?;
        let row = self
            .client
            .query_opt(statement, &[&floor, &step, &seq.name, &seen])
            .await
            .map_err(pg_err(&self.server, "reserve a block"))?;
        if let Some(row) = row {
            // Its guard, read in the same round trip.
            if !row.get::<_, bool>(2) {
                return Err(unguarded(&self.server, SEGMENT_TABLE));
            }
            return Ok(Stamped {
                value: Ok(row.get(0)),
                table: Some(row.get(1)),
            });
        }
        let exists = self
            .client
            .query_opt(
                &format!(
                    "SELECT max_id, pg_relation_filenode(tableoid)::bigint, (SELECT version FROM {VERSION_TABLE}) FROM {SEGMENT_TABLE} WHERE sequence_name = $1"
                ),
                &[&seq.name],
            )
            .await
            .map_err(pg_err(&self.server, "read the segment row"))?;
        match exists {
            Some(row) if row.get::<_, Option<i64>>(2) != self.lattice => {
                Err(lattice_moved(&self.server, &seq.name))
            }
            Some(row) => Ok(Stamped {
                value: Err(row.get(0)),
                table: Some(row.get(1)),
            }),
            None => Err(not_initialised(&self.server, seq)),
        }
    }

    /// The largest id the counter says may have been handed out. `None`: not initialised.
    async fn counter(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
    ) -> Result<Option<u64>, TicketError> {
        let err = pg_err(&self.server, "read the counter");
        match (seq.mode, config.postgres_tickets) {
            (Mode::Segment, _) => {
                let row = self
                    .client
                    .query_opt(
                        &format!("SELECT max_id FROM {SEGMENT_TABLE} WHERE sequence_name = $1"),
                        &[&seq.name],
                    )
                    .await
                    .map_err(err)?;
                Ok(row.map(|r| Lattice::new(config, server).counter_of_row(r.get(0))))
            }
            (Mode::PerId, PgTickets::Sequence) => {
                if !self.per_id_exists(config, seq).await? {
                    return Ok(None);
                }
                let row = self
                    .client
                    .query_one(
                        &format!("SELECT last_value, is_called FROM {}", seq.table()),
                        &[],
                    )
                    .await
                    .map_err(err)?;
                let (last, called): (i64, bool) = (row.get(0), row.get(1));
                Ok(Some(if called {
                    last as u64
                } else {
                    (last as u64).saturating_sub(1)
                }))
            }
            (Mode::PerId, PgTickets::Table) => {
                if !self.per_id_exists(config, seq).await? {
                    return Ok(None);
                }
                let row = self
                    .client
                    .query_opt(&format!("SELECT id FROM {}", seq.table()), &[])
                    .await
                    .map_err(err)?;
                Ok(Some(match row {
                    Some(r) => r.get::<_, i64>(0) as u64,
                    None => first_id(config, server, seq) - 1,
                }))
            }
        }
    }

    /// Raises the counter so that every later id is above `past`.
    async fn raise(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
        past: u64,
    ) -> Result<(), TicketError> {
        let to = first_of_residue(past, server.offset, config.increment);
        let sql = match (seq.mode, config.postgres_tickets) {
            (Mode::Segment, _) => raise_segment_sql(Lattice::new(config, server), seq, past),
            // Never below what it already handed out (`setval` alone can
            // set a sequence back under concurrent `nextval`s).
            (Mode::PerId, PgTickets::Sequence) => format!(
                "SELECT setval('{t}', GREATEST({to}, last_value), true) FROM {t}",
                t = seq.table()
            ),
            (Mode::PerId, PgTickets::Table) => format!(
                "INSERT INTO {t} AS t (stub, id) VALUES ('a', {to}) ON CONFLICT (stub) DO UPDATE SET id = GREATEST(t.id, {to})",
                t = seq.table()
            ),
        };
        self.client
            .batch_execute(&sql)
            .await
            .map_err(pg_err(&self.server, &format!("raise the counter ({sql})")))
    }

    /// Moves `seq` to the file's lattice, every later id above `past`: a
    /// per-id sequence takes the new increment, then every segment row or
    /// counter is raised.
    async fn reshape(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
        past: u64,
    ) -> Result<(), TicketError> {
        if seq.mode == Mode::PerId && config.postgres_tickets == PgTickets::Sequence {
            // The start is checked for the residue at every connect.
            let start = first_of_residue(past.saturating_add(1), server.offset, config.increment);
            let sql = format!(
                "ALTER SEQUENCE {} INCREMENT BY {} MAXVALUE {} START WITH {start}",
                seq.table(),
                config.increment,
                seq.max_id()
            );
            self.client
                .batch_execute(&sql)
                .await
                .map_err(pg_err(&self.server, &format!("reshape ({sql})")))?;
        }
        self.raise(config, server, seq, past).await
    }

    /// Raises (never lowers) high-water marks: `(server, sequence, id)`.
    async fn write_high_water(
        &mut self,
        marks: &[(String, String, u64)],
        mark_fence: Option<MarkFence<'_>>,
    ) -> Result<bool, TicketError> {
        if marks.is_empty() {
            return Ok(true);
        }
        let values = super::high_water_rows(marks);
        let fence = match mark_fence {
            Some(f) => format!(
                "{} AND {}",
                holder_fence(f.class, f.identity, "FOR SHARE"),
                super::lattice_fence(f.class, f.lattice, marks, "FOR SHARE")
            ),
            None => "true".to_string(),
        };
        let messages = self
            .client
            .simple_query(&format!(
                "INSERT INTO {HW_TABLE} AS h (server_name, sequence_name, high_water) SELECT * FROM (VALUES {values}) AS m WHERE {fence} ON CONFLICT (server_name, sequence_name) DO UPDATE SET high_water = GREATEST(h.high_water, EXCLUDED.high_water), updated_at = now()"
            ))
            .await
            .map_err(pg_err(&self.server, "write high-water marks"))?;
        // An upsert counts every row it touched: none means the fence.
        let written = messages
            .iter()
            .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::CommandComplete(n) if *n > 0));
        if !written && let Some(f) = mark_fence {
            let refused: i32 = self
                .client
                .query_one(
                    &super::lattice_fence_refuses(f.class, f.lattice, marks),
                    &[],
                )
                .await
                .map_err(pg_err(&self.server, "write high-water marks"))?
                .get(0);
            match refused {
                1 => return Err(super::lattice_fenced(&self.server, f.class, f.lattice)),
                super::NO_VERSION => return Err(super::no_version(&self.server)),
                _ => {}
            }
        }
        Ok(written)
    }

    async fn read_holder(&mut self, class: &str) -> Result<Option<Holder>, TicketError> {
        let row = self
            .client
            .query_opt(
                &format!("SELECT identity, generation, superseded FROM {HOLDERS_TABLE} WHERE class_key = $1"),
                &[&class],
            )
            .await
            .map_err(pg_err(&self.server, "read the class's holder"))?;
        Ok(row.map(|r| holder_of(r.get(0), r.get::<_, i64>(1) as u64, &r.get::<_, String>(2))))
    }

    /// In one transaction with `LOCK TABLE … IN SHARE MODE` on the marks
    /// first: it waits for every mark write under way (a write's fence
    /// read before this commits would not see the new holder) and holds
    /// off new ones, which then read the new holder.
    async fn claim(
        &mut self,
        class: &str,
        identity: &str,
        server: &str,
        from: Option<&Holder>,
    ) -> Result<bool, TicketError> {
        let name = self.server.clone();
        let err = || pg_err(&name, "take the class over");
        let tx = self.client.transaction().await.map_err(err())?;
        tx.batch_execute(&format!("LOCK TABLE {HW_TABLE} IN SHARE MODE"))
            .await
            .map_err(err())?;
        let changed = match from {
            None => tx
                .execute(
                    &format!("INSERT INTO {HOLDERS_TABLE} (class_key, identity, generation, server_name, superseded) SELECT $1, $2, 1, $3, '' WHERE EXISTS (SELECT 1 FROM {HOLDERS_TABLE} WHERE class_key = '') ON CONFLICT (class_key) DO NOTHING"),
                    &[&class, &identity, &server],
                )
                .await,
            Some(h) => tx
                .execute(
                    &format!("UPDATE {HOLDERS_TABLE} SET identity = $1, generation = generation + 1, server_name = $2, superseded = trim(superseded || ' ' || $3), updated_at = now() WHERE class_key = $4 AND generation = $5 AND identity = $3"),
                    &[&identity, &server, &h.identity, &class, &(h.generation as i64)],
                )
                .await,
        }
        .map_err(err())?;
        let init_row: bool = tx
            .query_one(
                &format!("SELECT EXISTS (SELECT 1 FROM {HOLDERS_TABLE} WHERE class_key = '')"),
                &[],
            )
            .await
            .map_err(err())?
            .get(0);
        tx.commit().await.map_err(err())?;
        match (changed, init_row) {
            (1, _) => Ok(true),
            (_, true) => Ok(false),
            _ => Err(super::holders_empty(&name)),
        }
    }

    /// The largest mark this server holds for `sequence`, of any server.
    async fn read_marks_of_sequence(&mut self, sequence: &str) -> Result<u64, TicketError> {
        let row = self
            .client
            .query_one(
                &format!("SELECT MAX(high_water) FROM {HW_TABLE} WHERE sequence_name = $1"),
                &[&sequence],
            )
            .await
            .map_err(pg_err(&self.server, "read high-water marks"))?;
        Ok(row.get::<_, Option<i64>>(0).unwrap_or(0) as u64)
    }

    /// When the server started, in unix seconds, and its identity: system
    /// identifier, timeline, database oid, data directory, port.
    async fn identify(&mut self) -> Result<ServerIdentity, TicketError> {
        let row = self
            .client
            .query_one(
                "SELECT CAST(EXTRACT(EPOCH FROM pg_postmaster_start_time()) AS bigint), concat_ws(':', 'postgres', (SELECT system_identifier FROM pg_control_system()), (SELECT timeline_id FROM pg_control_checkpoint()), (SELECT oid FROM pg_database WHERE datname = current_database()), current_setting('data_directory'), inet_server_port())",
                &[],
            )
            .await
            .map_err(pg_err(&self.server, "read the start time and identity"))?;
        Ok(ServerIdentity {
            started: row.get(0),
            id: clean_identity(&row.get::<_, String>(1)),
        })
    }

    /// The guarded tables without an enabled guard trigger.
    async fn unguarded(&mut self, config: &Config) -> Result<Vec<String>, TicketError> {
        let tables = guarded_tables(config, Kind::Postgres);
        if tables.is_empty() {
            return Ok(tables);
        }
        let rows = self
            .client
            .query(
                "SELECT t FROM unnest($1::text[]) AS t WHERE NOT EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = to_regclass(t) AND g.tgname = $2 AND g.tgenabled <> 'D')",
                &[&tables, &GUARD],
            )
            .await
            .map_err(pg_err(&self.server, "read the triggers"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Every lattice recorded here (none before `init`).
    async fn read_lattice(&mut self) -> Result<Vec<(String, LatticeRecord)>, TicketError> {
        if !self.relation_exists(LATTICE_TABLE).await? {
            return Ok(Vec::new());
        }
        let rows = self
            .client
            .query(
                &format!("SELECT sequence_name, server_name, increment, server_offset, mode, bits, chunk FROM {LATTICE_TABLE}"),
                &[],
            )
            .await
            .map_err(pg_err(&self.server, "read the recorded lattice"))?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get::<_, String>(0),
                    LatticeRecord {
                        server: r.get(1),
                        increment: r.get::<_, i64>(2) as u64,
                        offset: r.get::<_, i64>(3) as u64,
                        mode: r.get(4),
                        bits: r.get::<_, i32>(5) as u32,
                        chunk: r.get::<_, i64>(6) as u64,
                    },
                )
            })
            .collect())
    }

    /// The lattice's version (`None`: no [`VERSION_TABLE`], before `init`).
    async fn lattice_version(&mut self) -> Result<Option<LatticeVersion>, TicketError> {
        if !self.relation_exists(VERSION_TABLE).await? {
            return Ok(None);
        }
        let row = self
            .client
            .query_opt(
                &format!("SELECT version, reshaping FROM {VERSION_TABLE}"),
                &[],
            )
            .await
            .map_err(pg_err(&self.server, "read the lattice version"))?;
        Ok(row.map(|r| LatticeVersion {
            version: r.get(0),
            reshaping: r.get(1),
        }))
    }

    async fn read_marks_at(&mut self) -> Result<Option<String>, TicketError> {
        if !self.relation_exists(MARKS_AT_TABLE).await? {
            return Ok(None);
        }
        let row = self
            .client
            .query_opt(&format!("SELECT places FROM {MARKS_AT_TABLE}"), &[])
            .await
            .map_err(pg_err(&self.server, "read where the marks are kept"))?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn write_marks_at(&mut self, places: &str, replace: bool) -> Result<(), TicketError> {
        let conflict = if replace {
            "DO UPDATE SET places = EXCLUDED.places"
        } else {
            "DO NOTHING"
        };
        self.client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {MARKS_AT_TABLE} (one boolean PRIMARY KEY DEFAULT true CHECK (one), places text NOT NULL)"
            ))
            .await
            .map_err(pg_err(&self.server, "CREATE TABLE shardflake_ticket_marks_at"))?;
        self.client
            .execute(
                &format!(
                    "INSERT INTO {MARKS_AT_TABLE} (one, places) VALUES (true, $1) ON CONFLICT (one) {conflict}"
                ),
                &[&places],
            )
            .await
            .map_err(pg_err(&self.server, "record where the marks are kept"))?;
        Ok(())
    }

    async fn forget_marks_at(&mut self, places: &str) -> Result<(), TicketError> {
        self.client
            .execute(
                &format!("DELETE FROM {MARKS_AT_TABLE} WHERE places = $1"),
                &[&places],
            )
            .await
            .map_err(pg_err(&self.server, "take back where the marks are kept"))?;
        Ok(())
    }

    /// Kept for [`Backend::prepare`], which builds it into every statement.
    async fn pin_lattice(&mut self, version: i64) -> Result<(), TicketError> {
        self.lattice = Some(version);
        Ok(())
    }

    async fn begin_reshape(&mut self, to: i64) -> Result<(), TicketError> {
        self.client
            .batch_execute(&format!(
                "UPDATE {VERSION_TABLE} SET version = GREATEST(version + 1, {to}), reshaping = true"
            ))
            .await
            .map_err(pg_err(&self.server, "begin the reshape"))
    }

    async fn end_reshape(&mut self) -> Result<(), TicketError> {
        self.client
            .batch_execute(&format!("UPDATE {VERSION_TABLE} SET reshaping = false"))
            .await
            .map_err(pg_err(&self.server, "end the reshape"))
    }

    /// Records (replaces) the lattice of `sequence`.
    async fn write_lattice(
        &mut self,
        sequence: &str,
        r: &LatticeRecord,
    ) -> Result<(), TicketError> {
        self.client
            .execute(
                &format!("INSERT INTO {LATTICE_TABLE} AS l (sequence_name, server_name, increment, server_offset, mode, bits, chunk) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (sequence_name) DO UPDATE SET server_name = EXCLUDED.server_name, increment = EXCLUDED.increment, server_offset = EXCLUDED.server_offset, mode = EXCLUDED.mode, bits = EXCLUDED.bits, chunk = EXCLUDED.chunk"),
                &[&sequence, &r.server, &(r.increment as i64), &(r.offset as i64), &r.mode, &(r.bits as i32), &(r.chunk as i64)],
            )
            .await
            .map_err(pg_err(&self.server, &format!("record the lattice of {sequence} (INSERT INTO {LATTICE_TABLE})")))?;
        Ok(())
    }

    /// Every server this server holds marks of.
    async fn high_water_servers(&mut self) -> Result<Vec<String>, TicketError> {
        let rows = self
            .client
            .query(
                &format!("SELECT DISTINCT server_name FROM {HW_TABLE} WHERE server_name <> ''"),
                &[],
            )
            .await
            .map_err(pg_err(&self.server, "read high-water marks"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// The high-water marks this server holds under `holders`.
    async fn read_high_water(
        &mut self,
        holders: &[&str],
    ) -> Result<Vec<(String, u64)>, TicketError> {
        let rows = self
            .client
            .query(
                &format!(
                    "SELECT sequence_name, high_water FROM {HW_TABLE} WHERE server_name = ANY($1)"
                ),
                &[&holders],
            )
            .await
            .map_err(pg_err(&self.server, "read high-water marks"))?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
            .collect())
    }

    /// Creates what `config` needs, idempotently; returns what it did.
    async fn init(
        &mut self,
        config: &Config,
        server: &ServerConfig,
    ) -> Result<Vec<String>, TicketError> {
        let name = self.server.clone();
        let err = |context: &'static str| pg_err(&name, context);
        // The version before the records, as a session reads them.
        let version = self.lattice_version().await?;
        let recorded = self.read_lattice().await?;
        super::check_recorded_lattice(config, server, &recorded, version.as_ref())?;
        self.client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {LATTICE_TABLE} (sequence_name text PRIMARY KEY, server_name text NOT NULL, increment bigint NOT NULL, server_offset bigint NOT NULL, mode text NOT NULL, bits int NOT NULL, chunk bigint NOT NULL);
                 CREATE TABLE IF NOT EXISTS {HW_TABLE} (server_name text NOT NULL, sequence_name text NOT NULL, high_water bigint NOT NULL, updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (server_name, sequence_name));
                 CREATE TABLE IF NOT EXISTS {HOLDERS_TABLE} (class_key text PRIMARY KEY, identity text NOT NULL, generation bigint NOT NULL, server_name text NOT NULL, superseded text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now());
                 CREATE TABLE IF NOT EXISTS {SEGMENT_TABLE} (sequence_name text PRIMARY KEY, max_id bigint NOT NULL);
                 CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (one boolean PRIMARY KEY DEFAULT true CHECK (one), version bigint NOT NULL, reshaping boolean NOT NULL);
                 INSERT INTO {VERSION_TABLE} (one, version, reshaping) VALUES (true, 1, false) ON CONFLICT DO NOTHING;
                 INSERT INTO {HOLDERS_TABLE} (class_key, identity, generation, server_name, superseded) VALUES {} ON CONFLICT DO NOTHING;
                 {}",
                super::HOLDERS_INIT_ROW,
                guard_sql(SEGMENT_TABLE, "max_id")
            ))
            .await
            .map_err(err("init: CREATE TABLE shardflake_ticket_lattice, shardflake_ticket_hw, shardflake_ticket_segments"))?;
        let mut done = Vec::new();
        let n = config.increment;
        for seq in &config.sequences {
            let relation = self.relation_exists(&seq.table()).await?;
            let row = self
                .client
                .query_opt(
                    &format!("SELECT max_id FROM {SEGMENT_TABLE} WHERE sequence_name = $1"),
                    &[&seq.name],
                )
                .await
                .map_err(err("init"))?;
            let max = seq.max_id();
            let first = first_id(config, server, seq);
            match (seq.mode, config.postgres_tickets) {
                (Mode::PerId, style) => {
                    if row.is_some() {
                        return Err(mode_changed(&name, seq, "segment"));
                    }
                    self.per_id_exists(config, seq).await?;
                    let sql = match style {
                        PgTickets::Sequence => format!(
                            "CREATE SEQUENCE IF NOT EXISTS {} AS bigint INCREMENT BY {n} MINVALUE 1 MAXVALUE {max} START WITH {first} NO CYCLE CACHE 1",
                            seq.table()
                        ),
                        PgTickets::Table => format!(
                            "CREATE TABLE IF NOT EXISTS {t} (id bigint NOT NULL CHECK (id BETWEEN 1 AND {max}), stub char(1) NOT NULL DEFAULT '' UNIQUE);
                             {}",
                            guard_trigger_sql(&seq.table(), "id"),
                            t = seq.table()
                        ),
                    };
                    self.client
                        .batch_execute(&sql)
                        .await
                        .map_err(err("init: CREATE SEQUENCE/TABLE tickets_…"))?;
                    done.push(format!(
                        "{}: {} {} (INCREMENT {n}, first id {first}, max {max})",
                        seq.name,
                        if style == PgTickets::Sequence {
                            "sequence"
                        } else {
                            "table"
                        },
                        seq.table()
                    ));
                }
                (Mode::Segment, _) => {
                    if relation {
                        return Err(mode_changed(&name, seq, "per-id"));
                    }
                    let start_row = Lattice::new(config, server).row_above(seq.start - 1);
                    self.client
                        .execute(
                            &format!(
                                "INSERT INTO {SEGMENT_TABLE} AS s (sequence_name, max_id) VALUES ($1, $2) ON CONFLICT (sequence_name) DO UPDATE SET max_id = GREATEST(s.max_id, EXCLUDED.max_id)"
                            ),
                            &[&seq.name, &start_row],
                        )
                        .await
                        .map_err(err("init"))?;
                    done.push(format!("{}: segment row in {SEGMENT_TABLE}", seq.name));
                }
            }
            if !recorded.iter().any(|(q, _)| *q == seq.name) {
                self.write_lattice(&seq.name, &LatticeRecord::of(config, server, seq))
                    .await?;
            }
        }
        Ok(done)
    }

    /// Each sequence's increment, residue and counter.
    async fn settings(
        &mut self,
        config: &Config,
        server: &ServerConfig,
    ) -> Result<ServerSettings, TicketError> {
        let mut warnings = Vec::new();
        let sync: String = self
            .client
            .query_one("SELECT current_setting('synchronous_commit')", &[])
            .await
            .map_err(pg_err(&self.server, "read settings"))?
            .get(0);
        if sync == "off" {
            warnings.push(
                "synchronous_commit = off: a crash can lose the last tickets and hand them out again".to_string(),
            );
        }
        let unguarded = self.unguarded(config).await?;
        let mut sequences = Vec::new();
        for seq in &config.sequences {
            let counter = self.counter(config, server, seq).await?;
            let mut problem = None;
            let mut detail = match seq.mode {
                Mode::Segment => format!("segment row in {SEGMENT_TABLE}"),
                Mode::PerId => format!("table {}", seq.table()),
            };
            let guarded = match (seq.mode, config.postgres_tickets) {
                (Mode::Segment, _) => Some(SEGMENT_TABLE.to_string()),
                (Mode::PerId, PgTickets::Table) => Some(seq.table()),
                (Mode::PerId, PgTickets::Sequence) => None,
            };
            if counter.is_none() {
                problem = Some("not initialised (run `shardflake tickets init`)".to_string());
            } else if seq.mode == Mode::PerId && config.postgres_tickets == PgTickets::Sequence {
                detail = format!("sequence {}", seq.table());
                if let Err(e) = self.verify_sequence(config, server, seq).await {
                    problem = Some(e.to_string());
                }
            } else if let Some(table) = guarded
                && unguarded.contains(&table)
            {
                problem = Some(format!("{table}: {GUARD_MISSING}"));
            }
            sequences.push(SequenceState {
                name: seq.name.clone(),
                detail,
                counter,
                high_water: None,
                problem,
            });
        }
        Ok(ServerSettings {
            global: None,
            session: None,
            warnings,
            sequences,
        })
    }
}

/// The guard's function ([`GUARD`]): refuses a row set lower in
/// `TG_ARGV[0]`, or deleted, unless the transaction set
/// `shardflake.rewind` (an operator, every client stopped), then its
/// trigger on `table`.
fn guard_sql(table: &str, column: &str) -> String {
    let refusal = guard_refusal("%I", "SET LOCAL shardflake.rewind = on").replace('\'', "''");
    format!(
        "CREATE OR REPLACE FUNCTION {GUARD}() RETURNS trigger LANGUAGE plpgsql AS $guard$
         BEGIN
           IF coalesce(current_setting('shardflake.rewind', true), '') <> 'on'
              AND (TG_OP = 'DELETE'
                   OR (to_jsonb(NEW) ->> TG_ARGV[0])::numeric < (to_jsonb(OLD) ->> TG_ARGV[0])::numeric) THEN
             RAISE EXCEPTION USING MESSAGE = format('{refusal}', TG_TABLE_NAME);
           END IF;
           RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
         END $guard$;
         {}",
        guard_trigger_sql(table, column)
    )
}

/// The guard's trigger on `table`, watching `column` (the function exists).
fn guard_trigger_sql(table: &str, column: &str) -> String {
    format!(
        "CREATE OR REPLACE TRIGGER {GUARD} BEFORE UPDATE OR DELETE ON {table} FOR EACH ROW EXECUTE FUNCTION {GUARD}('{column}');"
    )
}
