//! MariaDB (and MySQL): the sandbox database, one table per scheme, its
//! statements.
//!
//! Every batch is one multi-row `INSERT IGNORE`, so that a repeated id is
//! counted (rows sent less rows stored) instead of failing the run; ids the
//! server makes come back through `RETURNING` (MariaDB 10.5 and later).

use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::{Conn, Opts, OptsBuilder, Params, Row, Value};
use shardflake_db::mysql::{self as db_mysql, Names};
use tokio::sync::Mutex;

use crate::error::CompareError;
use crate::ids::{ClientIds, Ids, bytes_key, int_key};
use crate::load::{self, Writer, Written, bounded};
use crate::pg::{BODY, SHARD_KEY};
use crate::report::{SchemeResult, ServerReport};
use crate::scheme::{MadeBy, Scheme, ServerKind};
use crate::{Options, Progress};

const SERVER: &str = "MariaDB";
use crate::SANDBOX_MARK_TABLE as MARK_TABLE;
/// `ER_LOCK_DEADLOCK`.
const ER_LOCK_DEADLOCK: u16 = 1213;

fn db(what: &str) -> impl FnOnce(mysql_async::Error) -> CompareError + '_ {
    move |e| CompareError::Db {
        server: SERVER,
        what: what.to_string(),
        message: e.to_string(),
    }
}

/// An error of `shardflake-db` (which installs and calls the in-database
/// ids) while doing `what`.
fn in_db(what: &str) -> impl FnOnce(shardflake_db::Error) -> CompareError + '_ {
    move |e| CompareError::Db {
        server: SERVER,
        what: what.to_string(),
        message: e.to_string(),
    }
}

async fn connect(opts: Opts, url: &str, limit: Duration) -> Result<Conn, CompareError> {
    bounded(SERVER, "connecting", limit, async {
        Conn::new(opts).await.map_err(|e| CompareError::Connect {
            server: SERVER,
            url: url.to_string(),
            message: e.to_string(),
        })
    })
    .await
}

pub(crate) async fn run(
    url: &str,
    opts: &Options,
    progress: Arc<dyn Progress>,
) -> Result<ServerReport, CompareError> {
    let t = opts.timeout;
    let server_opts = Opts::from_url(url).map_err(|e| CompareError::Connect {
        server: SERVER,
        url: url.to_string(),
        message: format!("not a MariaDB URL (mysql://user[:password]@host:port[/database]): {e}"),
    })?;
    let sandbox = opts.schema.as_str();
    let control_opts: Opts = OptsBuilder::from_opts(server_opts.clone())
        .db_name(None::<String>)
        .into();
    let mut control = connect(control_opts, url, t).await?;
    let version: String = bounded(SERVER, "reading the version", t, async {
        control
            .query_first("SELECT VERSION()")
            .await
            .map_err(db("reading the version"))?
            .ok_or_else(|| CompareError::Invalid("VERSION() returned no row".into()))
    })
    .await?;
    // Held by this connection until it closes: one run per sandbox.
    let locked: Option<Option<i64>> = bounded(SERVER, "taking the sandbox's lock", t, async {
        control
            .exec_first("SELECT GET_LOCK(?, 0)", (crate::sandbox_lock(sandbox),))
            .await
            .map_err(db("taking the sandbox's lock"))
    })
    .await?;
    if locked.flatten() != Some(1) {
        return Err(CompareError::Busy {
            server: SERVER,
            name: sandbox.to_string(),
        });
    }
    bounded(
        SERVER,
        "making the sandbox",
        t,
        make_sandbox(&mut control, sandbox),
    )
    .await?;
    let worker_opts: Opts = OptsBuilder::from_opts(server_opts)
        .db_name(Some(sandbox))
        .into();
    let results = run_schemes(url, &worker_opts, opts, &mut control, &progress).await;
    progress.phase("dropping the sandbox");
    let dropped = bounded(
        SERVER,
        "dropping the sandbox",
        t,
        drop_sandbox(&mut control, sandbox),
    )
    .await;
    if let Err(e) = &dropped {
        tracing::error!(error = %e, "the sandbox database {sandbox} is left behind: drop it with DROP DATABASE {sandbox}");
    }
    // Released here rather than at the disconnect, which the server ends
    // on its own time: a run right after this one finds the lock free.
    let _ = control
        .exec_drop("DO RELEASE_LOCK(?)", (crate::sandbox_lock(sandbox),))
        .await;
    let _ = control.disconnect().await;
    Ok(ServerReport {
        kind: ServerKind::Mariadb,
        version,
        sandbox: sandbox.to_string(),
        dropped: dropped.is_ok(),
        results: results?,
    })
}

async fn make_sandbox(control: &mut Conn, sandbox: &str) -> Result<(), CompareError> {
    let exists: Option<i64> = control
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
            (sandbox,),
        )
        .await
        .map_err(db("looking for the sandbox"))?;
    if exists.unwrap_or(0) > 0 {
        let marked: Option<i64> = control
            .exec_first(
                "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                (sandbox, MARK_TABLE),
            )
            .await
            .map_err(db("looking for the sandbox's mark"))?;
        if marked.unwrap_or(0) == 0 {
            return Err(CompareError::NotOurs {
                server: SERVER,
                kind: "database",
                name: sandbox.into(),
            });
        }
        tracing::warn!(
            "dropping database {sandbox}, left by an earlier shardflake compare that did not finish"
        );
        drop_sandbox(control, sandbox).await?;
    }
    control
        .query_drop(format!(
            "CREATE DATABASE `{sandbox}`; CREATE TABLE `{sandbox}`.`{MARK_TABLE}` (note varchar(64))"
        ))
        .await
        .map_err(db("making the sandbox"))
}

/// Drops the sandbox, first the clock event and its running loop (the
/// in-database scheme's), which would otherwise outlive the database.
async fn drop_sandbox(control: &mut Conn, sandbox: &str) -> Result<(), CompareError> {
    let names = Names::default();
    let exists: Option<i64> = control
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
            (sandbox,),
        )
        .await
        .map_err(db("looking for the sandbox"))?;
    if exists.unwrap_or(0) == 0 {
        return Ok(());
    }
    control
        .query_drop(format!(
            "USE `{sandbox}`; DROP EVENT IF EXISTS `{}`",
            names.event()
        ))
        .await
        .map_err(db("dropping the clock event"))?;
    let holder: Option<Option<u64>> = control
        .query_first(format!("SELECT IS_USED_LOCK({})", names.clock_lock_sql()))
        .await
        .map_err(db("looking for the clock event's loop"))?;
    if let Some(Some(id)) = holder {
        control
            .query_drop(format!("KILL CONNECTION {id}"))
            .await
            .map_err(db("stopping the clock event's loop"))?;
    }
    control
        .query_drop(format!("DROP DATABASE `{sandbox}`"))
        .await
        .map_err(db("dropping the sandbox"))
}

async fn run_schemes(
    url: &str,
    worker_opts: &Opts,
    opts: &Options,
    control: &mut Conn,
    progress: &Arc<dyn Progress>,
) -> Result<Vec<SchemeResult>, CompareError> {
    let mut results: Vec<SchemeResult> = Vec::new();
    let mut installed: Option<Result<(), String>> = None;
    // Warm up: the baseline, unmeasured, so that the scheme measured first
    // does not pay for a cold server (buffer pool, redo log) alone.
    let (warm, mut warmed) = opts.warm_up(ServerKind::Mariadb);
    progress.phase("warming the server up (unmeasured)");
    if let Err(e) = run_scheme(
        url,
        worker_opts,
        &warm,
        control,
        &crate::silent(),
        &mut installed,
        &mut warmed,
    )
    .await
    {
        tracing::warn!(error = %e, "warming up failed");
    }
    for &scheme in Scheme::for_server(ServerKind::Mariadb) {
        if !opts.wants(scheme) || opts.cancelled() {
            continue;
        }
        let mut r = SchemeResult::new(scheme, ServerKind::Mariadb);
        if let Err(e) = run_scheme(
            url,
            worker_opts,
            opts,
            control,
            progress,
            &mut installed,
            &mut r,
        )
        .await
        {
            tracing::warn!(scheme = scheme.name(), error = %e, "scheme failed");
            r.error = Some(e.to_string());
        }
        progress.finish();
        results.push(r);
    }
    crate::report::against_baseline(&mut results);
    Ok(results)
}

/// Installs what `mysql apply` installs (sequence, trigger, clock event,
/// procedures, the seed's too) in the sandbox, once; `Err` says why the
/// in-database schemes cannot run here.
async fn install(
    worker_opts: &Opts,
    url: &str,
    opts: &Options,
) -> Result<Result<(), String>, CompareError> {
    let mut conn = connect(worker_opts.clone(), url, opts.timeout).await?;
    let server = bounded(
        SERVER,
        "reading the server's settings",
        opts.timeout,
        async {
            db_mysql::server(&mut conn)
                .await
                .map_err(in_db("reading the server's settings"))
        },
    )
    .await?;
    if !server.has_sequences() {
        return Ok(Err(format!(
            "{} has no SEQUENCE objects (MariaDB 10.3 or later)",
            server.version
        )));
    }
    if server.event_scheduler != "ON" {
        return Ok(Err(format!(
            "the event scheduler is {} and compare changes no global setting; \
             run SET GLOBAL event_scheduler = ON (and put it in the server's configuration) to include it",
            server.event_scheduler
        )));
    }
    let layout = shardflake::preset::by_name("mysql-procedure")
        .map_err(|e| CompareError::Invalid(e.to_string()))?;
    let install = db_mysql::Options {
        seed: true,
        locked: false,
        // The sandbox's table, dropped at the end: not the application's.
        new_deployment: true,
        ..db_mysql::Options::default()
    };
    let applied = bounded(
        SERVER,
        "installing the in-database ids",
        opts.timeout,
        async {
            db_mysql::apply(&mut conn, &layout, &install)
                .await
                .map_err(in_db("installing the in-database ids (mysql apply)"))
        },
    )
    .await?;
    for w in &applied.warnings {
        tracing::warn!("mysql apply: {w}");
    }
    let _ = conn.disconnect().await;
    Ok(Ok(()))
}

#[allow(clippy::too_many_arguments)]
async fn run_scheme(
    url: &str,
    worker_opts: &Opts,
    opts: &Options,
    control: &mut Conn,
    progress: &Arc<dyn Progress>,
    installed: &mut Option<Result<(), String>>,
    r: &mut SchemeResult,
) -> Result<(), CompareError> {
    let t = opts.timeout;
    let scheme = r.scheme;
    let sandbox = &opts.schema;
    if matches!(
        scheme,
        Scheme::Trigger | Scheme::Procedure | Scheme::SeedProcedure
    ) {
        if installed.is_none() {
            progress.phase("installing the in-database ids (mysql apply)");
            *installed = Some(install(worker_opts, url, opts).await?);
        }
        if let Some(Err(why)) = installed {
            r.skipped = Some(why.clone());
            return Ok(());
        }
    }
    let version: String = control
        .query_first("SELECT VERSION()")
        .await
        .map_err(db("reading the version"))?
        .unwrap_or_default();
    let mariadb = version.contains("MariaDB");
    let table = match scheme {
        // `mysql apply` made it: id BIGINT AUTO_INCREMENT, user_id, body.
        Scheme::Trigger => "posts".to_string(),
        _ => format!("t_{}", scheme.name()),
    };
    progress.phase(&format!("{}: creating {table}", r.label));
    let rest = "user_id BIGINT NOT NULL, body TEXT";
    let ddl = match scheme {
        Scheme::Trigger => String::new(),
        Scheme::AutoIncrement => {
            format!("CREATE TABLE {table} (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, {rest})")
        }
        Scheme::ServerUuid | Scheme::UuidV4 | Scheme::UuidV7 => {
            format!("CREATE TABLE {table} (id BINARY(16) NOT NULL PRIMARY KEY, {rest})")
        }
        Scheme::ObjectId => {
            format!("CREATE TABLE {table} (id BINARY(12) NOT NULL PRIMARY KEY, {rest})")
        }
        Scheme::Tickets => format!(
            // Flickr's table, as the documents give it.
            "CREATE TABLE Tickets64 (id bigint(20) unsigned NOT NULL auto_increment, \
             stub char(1) NOT NULL default '', PRIMARY KEY (id), UNIQUE KEY stub (stub)) ENGINE=InnoDB; \
             CREATE TABLE {table} (id BIGINT NOT NULL PRIMARY KEY, {rest})"
        ),
        Scheme::Segment => format!(
            "CREATE TABLE segments (name varchar(32) PRIMARY KEY, max_id BIGINT NOT NULL); \
             INSERT INTO segments VALUES ('compare', 0); \
             CREATE TABLE {table} (id BIGINT NOT NULL PRIMARY KEY, {rest})"
        ),
        _ => format!("CREATE TABLE {table} (id BIGINT NOT NULL PRIMARY KEY, {rest})"),
    };
    if !ddl.is_empty() {
        bounded(SERVER, "creating the table", t, async {
            control
                .query_drop(format!("USE `{sandbox}`; {ddl}"))
                .await
                .map_err(db("creating the table"))
        })
        .await?;
    }
    // MySQL 8 has UUID_TO_BIN (the documents' way); MariaDB the older idiom.
    let uuid_expr = if mariadb {
        "UNHEX(REPLACE(UUID(), '-', ''))"
    } else {
        "UUID_TO_BIN(UUID())"
    };
    let returning = mariadb && !version.starts_with("10.4") && !version.starts_with("10.3");
    let client_ids = ClientIds::of(scheme)?.map(Arc::new);
    let segment = Arc::new(Mutex::new((1i64, 0i64)));
    let names = Names::default();
    let mut writers = Vec::with_capacity(opts.clients);
    for _ in 0..opts.clients {
        let conn = connect(worker_opts.clone(), url, t).await?;
        let source = match scheme.made_by() {
            MadeBy::Database => MySource::Database,
            MadeBy::Procedure => MySource::Procedure(if scheme == Scheme::SeedProcedure {
                names.seed_procedure()
            } else {
                names.procedure.clone()
            }),
            MadeBy::Client => MySource::Client(client_ids.clone().ok_or_else(|| {
                CompareError::Invalid(format!("{} has no client-side generator", scheme.name()))
            })?),
            MadeBy::TicketServer => MySource::Ticket,
            MadeBy::Segment => MySource::Segment(segment.clone(), opts.segment_step as i64),
        };
        writers.push(MyWriter {
            conn,
            scheme,
            table: table.clone(),
            source,
            timeout: t,
            returning,
            uuid_expr,
        });
    }
    let writers = load::generate_and_insert(
        writers,
        client_ids.as_ref(),
        ServerKind::Mariadb,
        opts,
        progress,
        r,
    )
    .await?;
    progress.phase(&format!("{}: measuring", r.label));
    (r.table_bytes, r.index_bytes) =
        bounded(SERVER, "measuring", t, sizes(control, sandbox, &table)).await?;
    if !opts.cancelled() {
        progress.phase(&format!("{}: deleting ~10%, inserting as many", r.label));
        let deleted = bounded(SERVER, "deleting ~10% of the rows", t, async {
            control
                .query_drop(format!(
                    "DELETE FROM `{sandbox}`.`{table}` WHERE RAND() < 0.1"
                ))
                .await
                .map_err(db("deleting ~10% of the rows"))?;
            Ok(control.affected_rows())
        })
        .await?;
        load::reinsert(writers, deleted, opts, progress, r).await?;
        (r.table_bytes_after_churn, r.index_bytes_after_churn) =
            bounded(SERVER, "measuring", t, sizes(control, sandbox, &table)).await?;
    }
    if scheme == Scheme::Trigger {
        // The procedures draw from the same sequence: keep the table's.
        return Ok(());
    }
    bounded(SERVER, "dropping the table", t, async {
        control
            .query_drop(format!("DROP TABLE `{sandbox}`.`{table}`"))
            .await
            .map_err(db("dropping the table"))
    })
    .await
}

/// Table bytes (clustered index + secondary indexes) and primary-key bytes
/// (InnoDB's clustered index, which holds the rows), after `ANALYZE`.
async fn sizes(control: &mut Conn, sandbox: &str, table: &str) -> Result<(u64, u64), CompareError> {
    control
        .query_drop(format!("ANALYZE TABLE `{sandbox}`.`{table}`"))
        .await
        .map_err(db("analyzing the table"))?;
    let row: Option<(u64, u64)> = control
        .exec_first(
            "SELECT DATA_LENGTH, INDEX_LENGTH FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            (sandbox, table),
        )
        .await
        .map_err(db("reading the table's size"))?;
    let (data, index) = row.unwrap_or((0, 0));
    Ok((data + index, data))
}

enum MySource {
    Database,
    Procedure(String),
    Client(Arc<ClientIds>),
    Ticket,
    /// Next and last id of the block in hand, shared; ids per block.
    Segment(Arc<Mutex<(i64, i64)>>, i64),
}

struct MyWriter {
    conn: Conn,
    scheme: Scheme,
    table: String,
    source: MySource,
    timeout: Duration,
    returning: bool,
    uuid_expr: &'static str,
}

impl MyWriter {
    async fn ids(&mut self, n: usize) -> Result<Ids, CompareError> {
        let conn = &mut self.conn;
        match &self.source {
            MySource::Database => Err(CompareError::Invalid("the database makes these ids".into())),
            MySource::Client(g) => g.take(self.scheme, n),
            MySource::Procedure(name) => {
                let mut ids = Vec::with_capacity(n);
                for _ in 0..n {
                    let id = db_mysql::generate_post_id(conn, name, SHARD_KEY)
                        .await
                        .map_err(|e| in_db(&format!("CALL {name}"))(e))?;
                    ids.push(id);
                }
                Ok(Ids::Int(ids))
            }
            MySource::Ticket => {
                let mut ids = Vec::with_capacity(n);
                for _ in 0..n {
                    // InnoDB deadlocks concurrent REPLACEs on the one row now
                    // and then (the statement is undone): try again, a bounded
                    // number of times, as the tickets client does.
                    let mut tries = 0u64;
                    loop {
                        match conn
                            .exec_drop("REPLACE INTO Tickets64 (stub) VALUES ('a')", ())
                            .await
                        {
                            Ok(()) => break,
                            Err(mysql_async::Error::Server(e))
                                if e.code == ER_LOCK_DEADLOCK && tries < 100 =>
                            {
                                // Apart from the sessions it collided with: a
                                // pause that differs per session, growing.
                                tries += 1;
                                let spread = u64::from(conn.id() % 7 + 1);
                                let pause = 50 * spread * tries.min(20);
                                tokio::time::sleep(Duration::from_micros(pause)).await;
                            }
                            Err(e) => return Err(db("taking a ticket")(e)),
                        }
                    }
                    ids.push(last_id(conn)?);
                }
                Ok(Ids::Int(ids))
            }
            MySource::Segment(buf, step) => {
                let mut ids = Vec::with_capacity(n);
                let mut range = buf.lock().await;
                while ids.len() < n {
                    if range.0 > range.1 {
                        conn.exec_drop(
                            "UPDATE segments SET max_id = LAST_INSERT_ID(max_id + ?) WHERE name = 'compare'",
                            (*step,),
                        )
                        .await
                        .map_err(db("reserving a segment"))?;
                        let max = last_id(conn)?;
                        *range = (max - step + 1, max);
                    }
                    let take = (range.1 - range.0 + 1).min((n - ids.len()) as i64);
                    ids.extend(range.0..range.0 + take);
                    range.0 += take;
                }
                Ok(Ids::Int(ids))
            }
        }
    }
}

fn last_id(conn: &Conn) -> Result<i64, CompareError> {
    conn.last_insert_id()
        .and_then(|v| i64::try_from(v).ok())
        .ok_or_else(|| CompareError::Db {
            server: SERVER,
            what: "reading LAST_INSERT_ID".into(),
            message: "no id in the OK packet".into(),
        })
}

impl Writer for MyWriter {
    async fn write(&mut self, n: usize) -> Result<Written, CompareError> {
        let limit = self.timeout;
        let users = std::iter::repeat_n(Value::Int(SHARD_KEY), n);
        if let MySource::Database = self.source {
            let (cols, group) = if self.scheme == Scheme::ServerUuid {
                ("id, user_id, body", format!("({}, ?, ?)", self.uuid_expr))
            } else {
                ("user_id, body", "(?, ?)".to_string())
            };
            let sql = format!(
                "INSERT IGNORE INTO `{}` ({cols}) VALUES {}{}",
                self.table,
                vec![group; n].join(", "),
                if self.returning { " RETURNING id" } else { "" }
            );
            let params: Vec<Value> = users.flat_map(|u| [u, Value::from(BODY)]).collect();
            let conn = &mut self.conn;
            let (rows, affected) = bounded(SERVER, "inserting", limit, async {
                let rows: Vec<Row> = conn
                    .exec(sql, Params::Positional(params))
                    .await
                    .map_err(db("inserting"))?;
                Ok((rows, conn.affected_rows()))
            })
            .await?;
            if !self.returning {
                return Ok(Written {
                    inserted: affected,
                    keys: Vec::new(),
                });
            }
            let keys = rows
                .into_iter()
                .map(|mut row| match row.take::<Value, _>(0) {
                    Some(Value::Bytes(b)) if self.scheme == Scheme::ServerUuid => bytes_key(&b),
                    Some(Value::Int(i)) => int_key(i),
                    Some(Value::UInt(u)) => int_key(u as i64),
                    _ => 0,
                })
                .collect::<Vec<_>>();
            return Ok(Written {
                inserted: keys.len() as u64,
                keys,
            });
        }
        let ids = bounded(SERVER, "taking ids", limit, self.ids(n)).await?;
        let keys = ids.keys();
        let values: Vec<Value> = match ids {
            Ids::Int(v) => v.into_iter().map(Value::Int).collect(),
            Ids::Uuid(v) => v
                .into_iter()
                .map(|u| Value::Bytes(u.as_bytes().to_vec()))
                .collect(),
            Ids::Bytes(v) => v.into_iter().map(Value::Bytes).collect(),
        };
        let params: Vec<Value> = values
            .into_iter()
            .zip(users)
            .flat_map(|(id, u)| [id, u, Value::from(BODY)])
            .collect();
        let sql = format!(
            "INSERT IGNORE INTO `{}` (id, user_id, body) VALUES {}",
            self.table,
            vec!["(?, ?, ?)"; n].join(", ")
        );
        let conn = &mut self.conn;
        let inserted = bounded(SERVER, "inserting", limit, async {
            conn.exec_drop(sql, Params::Positional(params))
                .await
                .map_err(db("inserting"))?;
            Ok(conn.affected_rows())
        })
        .await?;
        Ok(Written { inserted, keys })
    }

    async fn take_ids(&mut self, n: usize) -> Option<Result<(), CompareError>> {
        match self.source {
            MySource::Ticket | MySource::Segment(..) => Some(
                bounded(SERVER, "taking ids", self.timeout, self.ids(n))
                    .await
                    .map(drop),
            ),
            _ => None,
        }
    }
}
