//! `pg adopt`: an existing table's id column (`bigserial`, an identity
//! column, a plain `DEFAULT nextval(...)`) switched to a shard's
//! `next_id()` while the application keeps writing.
//!
//! The adopted table draws from the one sequence of one logical shard of
//! its server (`--shard`, by default the server's lowest), through the
//! same `next_id` the shard's own tables use: same layout, same guards
//! (a restored shard refuses ids, SF003; a restarted server, SF005, until
//! `pg repair`). Its default is an ordinary expression calling that
//! function, so PostgreSQL records the dependency (`pg_depend`) and
//! `pg_dump` restores the function before the table.
//!
//! Each table is switched in a transaction of its own that takes the
//! deployment lock, then `ACCESS EXCLUSIVE` on the table (what `ALTER
//! TABLE ... SET DEFAULT` takes anyway; waiting at most
//! [`LOCK_TIMEOUT`]): inserts wait for the few statements that follow, no
//! row can be added between the read of `max(id)` and the switch, and
//! the switch is refused unless `max(id)` is below the first id the shard
//! can make from now on. So every new id sorts after every old one.
//! Old ids stay as they are; the old sequence is kept (an identity's is
//! copied first: dropping the identity drops its sequence), fenced at its
//! value so that a default put back on it fails rather than hands out
//! ids (`fence`), and recorded with the largest old id (the floor) in
//! `shardflake.adopted` on the server, which `pg check` compares with
//! each column's default. Only an id column with a primary key or a
//! unique index of its own is adopted: nothing else refuses an id
//! stored twice.

use super::catalog::{self, State};
use super::topology::shard_field;
use super::*;

/// How long the switch waits for the table's lock before giving up (the
/// application's inserts queue behind a waiting `ALTER TABLE`).
pub const LOCK_TIMEOUT: &str = "5s";

/// The records of adopted tables, in the deployment schema of the server.
pub const ADOPTED_TABLE: &str = "shardflake.adopted";

const ADOPTED_DDL: &str = "CREATE TABLE IF NOT EXISTS shardflake.adopted (
  tbl text NOT NULL,
  col text NOT NULL,
  shard bigint NOT NULL,
  floor_id bigint,
  first_new bigint NOT NULL,
  old_default text NOT NULL,
  old_sequence text,
  adopted_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tbl, col))";

/// `shardflake.decode_id(id, table)`: `decode_id(id)`, except for an id
/// from before the table's adoption (at or below its floor), which has no
/// time, shard or sequence: those are null, `before_adoption` true.
const DECODE_DDL: &str =
    "CREATE OR REPLACE FUNCTION shardflake.decode_id(id bigint, of_table regclass,
  OUT unix_ms bigint, OUT ts timestamptz, OUT shard integer, OUT sequence integer,
  OUT before_adoption boolean)
LANGUAGE sql STABLE AS $f$
  SELECT CASE WHEN o.old THEN NULL ELSE d.unix_ms END, CASE WHEN o.old THEN NULL ELSE d.ts END,
         CASE WHEN o.old THEN NULL ELSE d.shard END, CASE WHEN o.old THEN NULL ELSE d.sequence END,
         o.old
    FROM shardflake.decode_id(id) d,
         (SELECT coalesce(bool_or(id <= a.floor_id), false) AS old
            FROM shardflake.adopted a
            JOIN pg_class c ON c.oid = of_table
            JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE a.tbl = format('%I.%I', n.nspname, c.relname)) o
$f$";

/// Which tables to adopt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One table, `schema.table` (or a name the search path finds).
    Table(String),
    /// Every table of a schema with the column.
    Schema(String),
    /// Every table whose `schema.table` matches a SQL `LIKE` pattern.
    Pattern(String),
}

/// What `pg adopt` is asked to do.
#[derive(Debug, Clone)]
pub struct AdoptOptions {
    /// The tables.
    pub target: Target,
    /// The id column (`id` by default in the CLI).
    pub column: String,
    /// Only this server of the file (default: every server).
    pub server: Option<String>,
    /// The logical shard whose sequence the tables draw from (default:
    /// the lowest shard of each server); tables on a server the file does
    /// not put it on are refused.
    pub shard: Option<u64>,
    /// Plan and print the SQL; change nothing.
    pub dry_run: bool,
}

/// What happened (or, in a dry run, would happen) to one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopted {
    /// Server name.
    pub server: String,
    /// `schema.table`.
    pub table: String,
    /// The id column.
    pub column: String,
    /// The logical shard it draws from.
    pub shard: u64,
    /// The largest old id (none in an empty table): ids at or below it
    /// are from before adoption.
    pub floor: Option<i64>,
    /// The sequence the column drew from, kept.
    pub old_sequence: Option<String>,
    /// Already adopted: nothing was (or would be) changed.
    pub unchanged: bool,
    /// The statements of the switch (run, or to be run).
    pub sql: Vec<String>,
}

impl fmt::Display for Adopted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let floor = self
            .floor
            .map_or("no old ids".to_string(), |v| format!("old ids up to {v}"));
        let old = self
            .old_sequence
            .as_deref()
            .map_or(String::new(), |s| format!("; old sequence {s} kept"));
        if self.unchanged {
            write!(
                f,
                "{}: {}.{} already draws from shard {} ({floor}): unchanged",
                self.server, self.table, self.column, self.shard
            )
        } else {
            write!(
                f,
                "{}: {}.{} draws from shard {} ({floor}){old}",
                self.server, self.table, self.column, self.shard
            )
        }
    }
}

impl Adopted {
    /// The whole transaction of the switch, as `--dry-run` prints it
    /// (empty for a table already adopted).
    pub fn script(&self) -> String {
        if self.unchanged {
            return String::new();
        }
        let (t, col) = (&self.table, &self.column);
        let mut s = format!(
            "BEGIN;\nSELECT pg_advisory_xact_lock({DEPLOYMENT_LOCK});  -- the deployment lock\n\
             SET LOCAL lock_timeout = '{LOCK_TIMEOUT}';\n\
             LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE;  -- inserts wait until COMMIT\n\
             SELECT max({col}) FROM {t};  -- refused unless below the first id shard {} makes now\n",
            self.shard
        );
        for stmt in &self.sql {
            s.push_str(stmt);
            s.push_str(";\n");
        }
        if let Some(seq) = &self.old_sequence {
            let kept = if self.sql.iter().any(|s| s.ends_with("DROP IDENTITY")) {
                kept_identity_sequence(seq)
            } else {
                seq.clone()
            };
            s.push_str(&format!(
                "ALTER SEQUENCE {kept} NO CYCLE MAXVALUE ...;  -- fenced at its value: every nextval() on it fails\n"
            ));
        }
        s.push_str(&format!(
            "INSERT INTO {ADOPTED_TABLE} ... ;  -- the table, its shard, the largest old id, the old sequence\nCOMMIT;\n"
        ));
        s
    }
}

/// One adopted table as its server records it ([`adopted`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdoptedTable {
    /// Server name.
    pub server: String,
    /// `schema.table`.
    pub table: String,
    /// The id column.
    pub column: String,
    /// The logical shard it draws from.
    pub shard: u64,
    /// Ids at or below it are from before adoption.
    pub floor: Option<i64>,
    /// The sequence kept.
    pub old_sequence: Option<String>,
    /// The column's default now.
    pub default: Option<String>,
}

impl AdoptedTable {
    /// Whether `id` was made before the table was adopted.
    pub fn before_adoption(&self, id: i64) -> bool {
        self.floor.is_some_and(|f| id <= f)
    }
}

/// A candidate column, as the catalog describes it.
struct Column {
    table: String,
    oid: u32,
    ty: String,
    identity: bool,
    default: Option<String>,
    sequence: Option<String>,
}

/// Adopts the tables of `opts` on every server of the file (or the one
/// named): first every table is planned and every refusal gathered
/// (nothing changes if there is one), then each table is switched in its
/// own short transaction, the floor checked again under its lock.
/// Running it again changes nothing.
///
/// The whole run holds the deployment lock on every server of the file
/// (a session lock: each table commits on the way), so a second adopt
/// (or an apply, repair or move) waits for it to end, then plans from
/// what it left. The file is checked against the servers' records first,
/// as `pg apply` checks it: one older than a move is refused. A run that
/// stops after switching some tables says which ([`Error::AdoptStopped`]).
pub async fn adopt(topo: &Topology, opts: &AdoptOptions) -> Result<Vec<Adopted>, Error> {
    if !super::topology::is_ident(&opts.column) {
        return Err(refused(
            "adopt",
            vec![Drift {
                server: "-".into(),
                shard: None,
                problem: format!(
                    "column {:?} must be a lower-case SQL identifier; name it with --column",
                    opts.column
                ),
            }],
        ));
    }
    let servers: Vec<usize> = match &opts.server {
        Some(name) => match topo.servers().iter().position(|s| &s.name == name) {
            Some(i) => vec![i],
            None => return Err(TopologyError::UnknownServer(name.clone()).into()),
        },
        None => (0..topo.servers().len()).collect(),
    };
    let mut clients = connect_all(topo).await?;
    lock_deployment(&clients, &server_names(topo), Lock::Session).await?;
    let mut views = Vec::new();
    for (c, server) in clients.iter().zip(topo.servers()) {
        views.push(catalog::read(c, &server.name, topo).await?);
    }
    let mut problems = catalog::conflicts(topo, &views, &[]);
    problems.extend(catalog::replaced_copies(&views, &[]));
    if let Some(p) = negative_ids(topo) {
        problems.push(Drift {
            server: "-".into(),
            shard: None,
            problem: p,
        });
    }
    let mut plans = Vec::new();
    let mut matched = 0;
    for i in servers {
        let (server, c, view) = (&topo.servers()[i], &clients[i], &views[i]);
        let name = server.name.as_str();
        let d = |shard, problem| Drift {
            server: name.to_string(),
            shard,
            problem,
        };
        let columns = columns(c, name, topo, &opts.target, &opts.column).await?;
        if columns.is_empty() {
            continue;
        }
        matched += columns.len();
        let shard = match opts.shard {
            Some(s) if server.shards.contains(&s) => s,
            // A table draws from a shard of its own server: never another
            // shard than the one asked for.
            Some(s) => {
                let tables = columns
                    .iter()
                    .map(|c| c.table.as_str())
                    .collect::<Vec<_>>()
                    .join(", ");
                let holder = match topo.server_of(s) {
                    Ok(holder) => format!(
                        "the file puts shard {s} on server {0}, not on {name}, which holds {tables}: name one of {name}'s shards ({1}) with --shard, or, for tables on {0}, run shardflake pg adopt --server {0} --shard {s}",
                        holder.name,
                        super::topology::format_shard_list(&server.shards)
                    ),
                    Err(_) => format!(
                        "the file has no shard {s}; {name}, which holds {tables}, holds shards {}: name one with --shard",
                        super::topology::format_shard_list(&server.shards)
                    ),
                };
                problems.push(d(Some(s), holder));
                continue;
            }
            // No shard asked for: each server draws from its own lowest.
            None => match server.shards.first() {
                Some(&s) => s,
                None => {
                    problems.push(d(None, format!("holds tables to adopt ({}) but no shard for them to draw from: move one there first (shardflake pg move-shard N --to {name})", columns.iter().map(|c| c.table.as_str()).collect::<Vec<_>>().join(", "))));
                    continue;
                }
            },
        };
        if view.state(shard) != Some(State::Live)
            || !relation_exists(c, name, &sql::shard_sequence(&topo.schema(shard))).await?
        {
            problems.push(d(Some(shard), format!("shard {shard} is not live on this server (run shardflake pg apply first: adopted tables draw from a shard's next_id())")));
            continue;
        }
        for p in [
            restored(c, topo, name, shard).await?,
            restarted(c, topo, name, shard).await?,
        ]
        .into_iter()
        .flatten()
        {
            problems.push(d(Some(shard), p));
        }
        let records = records(c, name).await?;
        for col in columns {
            let record = records
                .iter()
                .find(|r| r.table == col.table && r.column == opts.column);
            match plan(c, topo, name, shard, opts, &col, record).await? {
                Ok(Some(p)) => plans.push((i, p)),
                Ok(None) => {}
                Err(p) => problems.push(d(Some(shard), p)),
            }
        }
    }
    if matched == 0 {
        problems.push(Drift {
            server: opts.server.clone().unwrap_or_else(|| "-".into()),
            shard: None,
            problem: format!(
                "no table matches {:?} with a column {:?}",
                opts.target, opts.column
            ),
        });
    }
    if !problems.is_empty() {
        return Err(refused("adopt", problems));
    }
    let mut out: Vec<Adopted> = Vec::new();
    let mut plans = plans.into_iter();
    while let Some((i, p)) = plans.next() {
        if p.unchanged
            && !opts.dry_run
            && let Some(seq) = &p.old_sequence
        {
            // Adopted by a version that left the kept sequence unfenced.
            let name = p.server.clone();
            let tx = clients[i]
                .transaction()
                .await
                .map_err(ctx(&name, "begin"))?;
            fence(&tx, &name, seq).await?;
            tx.commit().await.map_err(ctx(&name, "commit"))?;
        }
        if opts.dry_run || p.unchanged {
            out.push(p);
            continue;
        }
        let table = format!("{}: {}.{}", p.server, p.table, p.column);
        match switch(topo, &mut clients[i], p).await {
            Ok(done) => out.push(done),
            // Tables switched before this one stay switched (each
            // committed): say which, never "nothing was changed".
            Err(error) if out.iter().any(|a| !a.unchanged) => {
                return Err(Error::AdoptStopped {
                    command: "pg adopt",
                    switched: out
                        .iter()
                        .filter(|a| !a.unchanged)
                        .map(ToString::to_string)
                        .collect(),
                    stopped_at: table,
                    not_reached: plans
                        .filter(|(_, p)| !p.unchanged)
                        .map(|(_, p)| format!("{}: {}.{}", p.server, p.table, p.column))
                        .collect(),
                    problem: match error {
                        Error::Refused { problems, .. } => problems.join("; "),
                        other => other.to_string(),
                    },
                });
            }
            Err(error) => return Err(error),
        }
    }
    Ok(out)
}

/// Why `sign_bit = "allow"` breaks adoption, for a layout that uses the
/// sign bit: from its date on, ids are negative and sort before every old
/// id.
fn negative_ids(topo: &Topology) -> Option<String> {
    let l = topo.layout();
    let t = l.time();
    if topo.sign_bit() != SignBit::Allow || !l.uses_sign_bit() || t.shift() + t.bits() != 64 {
        return None;
    }
    let ms = (1u64 << (t.bits() - 1))
        .saturating_mul(l.tick_ms())
        .saturating_add(l.epoch_ms());
    Some(format!(
        "layout {} with sign_bit = \"allow\" makes negative ids from {}, which sort before every old id; set sign_bit = \"refuse\" (next_id then stops at that date instead) or use a layout of 63 bits",
        l.name(),
        shardflake::timestamp::rfc3339_ms(ms)
    ))
}

/// The tables of `target` (never a shard's own, nor the deployment's) with
/// a column `column`.
async fn columns(
    c: &Client,
    name: &str,
    topo: &Topology,
    target: &Target,
    column: &str,
) -> Result<Vec<Column>, Error> {
    let (filter, arg) = match target {
        Target::Table(t) => ("c.oid = to_regclass($2)", t.as_str()),
        Target::Schema(s) => ("n.nspname = $2", s.as_str()),
        Target::Pattern(p) => ("format('%s.%s', n.nspname, c.relname) LIKE $2", p.as_str()),
    };
    let rows = c
        .query(
            &format!(
                "SELECT format('%I.%I', n.nspname, c.relname), c.oid, format_type(a.atttypid, a.atttypmod),
                        a.attidentity <> '', pg_get_expr(d.adbin, d.adrelid),
                        pg_get_serial_sequence(format('%I.%I', n.nspname, c.relname), a.attname)
                   FROM pg_class c
                   JOIN pg_namespace n ON n.oid = c.relnamespace
                   JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = $1 AND NOT a.attisdropped
                   LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
                  WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND {filter}
                    AND n.nspname <> $3 AND n.nspname !~ $4
                    AND n.nspname NOT IN ('pg_catalog', 'information_schema')
                  ORDER BY 1"
            ),
            &[
                &column,
                &arg,
                &sql::DEPLOYMENT_SCHEMA,
                &format!("^{}[0-9]+$", topo.schema_prefix()),
            ],
        )
        .await
        .map_err(ctx(name, "listing the tables to adopt"))?;
    Ok(rows
        .iter()
        .map(|r| {
            let default: Option<String> = r.get(4);
            let serial: Option<String> = r.get(5);
            Column {
                table: r.get(0),
                oid: r.get(1),
                ty: r.get(2),
                identity: r.get(3),
                sequence: serial.or_else(|| default.as_deref().and_then(nextval_of)),
                default,
            }
        })
        .collect())
}

/// The sequence of a `nextval('seq'::regclass)` default.
fn nextval_of(default: &str) -> Option<String> {
    let rest = default.trim().strip_prefix("nextval('")?;
    let (seq, tail) = rest.split_once("'::regclass)")?;
    tail.is_empty().then(|| seq.replace("''", "'"))
}

/// The adopted tables a server records.
async fn records(c: &Client, name: &str) -> Result<Vec<AdoptedTable>, Error> {
    if !relation_exists(c, name, ADOPTED_TABLE).await? {
        return Ok(Vec::new());
    }
    let rows = c
        .query(
            "SELECT r.tbl, r.col, r.shard, r.floor_id, r.old_sequence,
                    (SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d
                       JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
                      WHERE d.adrelid = to_regclass(r.tbl) AND a.attname = r.col)
               FROM shardflake.adopted r ORDER BY 1, 2",
            &[],
        )
        .await
        .map_err(ctx(name, "reading the adopted tables"))?;
    Ok(rows
        .iter()
        .map(|r| AdoptedTable {
            server: name.to_string(),
            table: r.get(0),
            column: r.get(1),
            shard: r.get::<_, i64>(2) as u64,
            floor: r.get(3),
            old_sequence: r.get(4),
            default: r.get(5),
        })
        .collect())
}

/// The first id the shard can hand out from now on: its sequence only
/// goes up, and no value is handed out more than the catch-up lag behind
/// the clock (see [`sql`]).
async fn first_new_id(
    c: &impl GenericClient,
    topo: &Topology,
    name: &str,
    shard: u64,
) -> Result<i64, Error> {
    let l = topo.layout();
    let seq = sql::shard_sequence(&topo.schema(shard));
    let row = c
        .query_one(
            &format!(
                "SELECT last_value, floor(date_part('epoch', clock_timestamp()) * 1000)::bigint FROM {seq}"
            ),
            &[],
        )
        .await
        .map_err(ctx(name, &format!("reading {seq}")))?;
    let (last, now_ms): (i64, i64) = (row.get(0), row.get(1));
    let ticks = (now_ms - l.epoch_ms() as i64).max(0) / l.tick_ms().max(1) as i64;
    let clock = ticks << l.sequence().bits();
    let w = last
        .max(clock - sql::lag_tolerance(l) - sql::catch_up_gap(l))
        .max(0);
    Ok(encode(topo, shard, w))
}

/// The id a packed sequence value `w` makes on `shard` (as `next_id`).
fn encode(topo: &Topology, shard: u64, w: i64) -> i64 {
    let l = topo.layout();
    let q = l.sequence();
    let (time, seq) = ((w as u64) >> q.bits(), (w as u64) & q.max());
    ((time << l.time().shift()) | (shard << shard_field(l).shift()) | (seq << q.shift())) as i64
}

/// One table's plan: `Ok(None)` to skip (a table of a schema or pattern
/// with no sequence default), `Err` a refusal with its fix.
async fn plan(
    c: &Client,
    topo: &Topology,
    name: &str,
    shard: u64,
    opts: &AdoptOptions,
    col: &Column,
    record: Option<&AdoptedTable>,
) -> Result<Result<Option<Adopted>, String>, Error> {
    let column = opts.column.as_str();
    let explicit = matches!(opts.target, Target::Table(_));
    // Without --shard, an adopted table keeps its shard (run again, it
    // changes nothing); with it, the table moves onto that shard, its
    // new ids still above every id it holds.
    let shard = match (opts.shard, record) {
        (None, Some(r)) => r.shard,
        _ => shard,
    };
    if topo.server_of(shard)?.name != name {
        return Ok(Err(format!(
            "{}.{column} was adopted onto shard {shard}, which the file puts on another server: name a shard of {name} with --shard",
            col.table
        )));
    }
    let call = sql::next_id_call(&topo.schema(shard));
    let t = &col.table;
    let mut out = Adopted {
        server: name.to_string(),
        table: t.clone(),
        column: column.to_string(),
        shard,
        floor: None,
        old_sequence: col.sequence.clone(),
        unchanged: false,
        sql: Vec::new(),
    };
    if col.default.as_deref() == Some(call.as_str()) {
        // A default set by hand, not recorded: no sequence of its was kept.
        out.old_sequence = None;
        if let Some(r) = record {
            out.floor = r.floor;
            out.old_sequence = r.old_sequence.clone();
        }
        out.unchanged = true;
        return Ok(Ok(Some(out)));
    }
    // A column changed back by hand is adopted again, whatever its default.
    if col.sequence.is_none() && !col.identity && record.is_none() {
        if !explicit {
            return Ok(Ok(None));
        }
        return Ok(Err(format!(
            "{t}.{column} has no sequence default (default: {}): pg adopt switches only a bigserial, identity or DEFAULT nextval(...) column",
            col.default.as_deref().unwrap_or("none")
        )));
    }
    if let Some(p) = no_unique_index(c, name, &col.table, column).await? {
        return Ok(Err(p));
    }
    if col.ty != "bigint" {
        return Ok(Err(format!(
            "{t}.{column} is {}, too narrow for 64-bit ids: widen it first (it rewrites the table under an exclusive lock): ALTER TABLE {t} ALTER COLUMN {column} TYPE bigint; then run pg adopt again",
            col.ty
        )));
    }
    let narrow = c
        .query(
            "SELECT format('%I.%I', n.nspname, r.relname), a.attname, format_type(a.atttypid, a.atttypmod)
               FROM pg_constraint k
               JOIN pg_class r ON r.oid = k.conrelid
               JOIN pg_namespace n ON n.oid = r.relnamespace
               JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = ANY (k.conkey)
               JOIN pg_attribute ra ON ra.attrelid = k.confrelid AND ra.attnum = ANY (k.confkey)
              WHERE k.contype = 'f' AND k.confrelid = $1 AND ra.attname = $2
                AND array_position(k.conkey, a.attnum) = array_position(k.confkey, ra.attnum)
                AND a.atttypid <> 'bigint'::regtype
              ORDER BY 1, 2",
            &[&col.oid, &column],
        )
        .await
        .map_err(ctx(name, "reading the foreign keys to the column"))?;
    if !narrow.is_empty() {
        let fixes: Vec<String> = narrow
            .iter()
            .map(|r| {
                let (rel, a, ty): (String, String, String) = (r.get(0), r.get(1), r.get(2));
                format!("{rel}.{a} ({ty}): ALTER TABLE {rel} ALTER COLUMN {a} TYPE bigint")
            })
            .collect();
        return Ok(Err(format!(
            "{t}.{column} is referenced by narrower columns that could not hold its new ids, so inserts referring to them would fail: widen each first, then run pg adopt again: {}",
            fixes.join("; ")
        )));
    }
    if col.identity
        && let Some(seq) = &col.sequence
    {
        // Dropping the identity drops its sequence, and whatever else
        // uses it: refuse rather than cascade.
        let users: Vec<String> = c
            .query(
                "SELECT pg_describe_object(d.classid, d.objid, d.objsubid)
                   FROM pg_depend d
                  WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = to_regclass($1)
                    AND d.deptype = 'n' ORDER BY 1",
                &[seq],
            )
            .await
            .map_err(ctx(name, "reading what uses the identity's sequence"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if !users.is_empty() {
            return Ok(Err(format!(
                "{t}.{column} is an identity column whose sequence {seq} is also used by {}: dropping the identity would drop them; make them use another sequence first, then run pg adopt again",
                users.join(", ")
            )));
        }
    }
    let max: Option<i64> = c
        .query_one(&format!("SELECT max({column}) FROM {t}"), &[])
        .await
        .map_err(ctx(name, &format!("reading max({column}) of {t}")))?
        .get(0);
    let first = first_new_id(c, topo, name, shard).await?;
    if let Some(p) = too_high(topo, t, column, max, first) {
        return Ok(Err(p));
    }
    out.floor = max;
    out.sql = switch_sql(topo, shard, t, column, col);
    Ok(Ok(Some(out)))
}

/// Why an id column without a primary key or a unique index on it alone
/// cannot be adopted: nothing refuses an id stored twice (a restore of a
/// dump from before adoption under writers adds the dump's rows to those
/// still there, and its key's build then fails), and neither adopt nor
/// check could tell. A partial or invalid index does not count.
async fn no_unique_index(
    c: &Client,
    name: &str,
    table: &str,
    column: &str,
) -> Result<Option<String>, Error> {
    let unique: bool = c
        .query_one(
            "SELECT EXISTS (
               SELECT 1 FROM pg_index i
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indisvalid AND i.indnkeyatts = 1
                  AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = $2)",
            &[&table, &column],
        )
        .await
        .map_err(ctx(name, &format!("reading the unique indexes of {table}")))?
        .get(0);
    Ok((!unique).then(|| format!(
        "{table}.{column} has no primary key or unique index, so nothing refuses an id stored twice (a restore under writers adds a dump's rows to the rows there): add one, then run pg adopt again: ALTER TABLE {table} ADD PRIMARY KEY ({column}) (it fails, naming a value, while ids are stored twice: delete or renumber those rows first)"
    )))
}

/// Why old ids block adoption: some are at or above the first id the
/// shard makes now, so new ids would not all sort after them.
fn too_high(
    topo: &Topology,
    t: &str,
    column: &str,
    max: Option<i64>,
    first: i64,
) -> Option<String> {
    let max = max.filter(|&m| m >= first)?;
    let date = shardflake::Id(max as u64)
        .decode(topo.layout())
        .map(|p| p.timestamp().to_string())
        .unwrap_or_else(|_| "past the layout's end".into());
    Some(format!(
        "{t}.{column} holds ids up to {max}, at or above {first}, the first id shard ids can be now: new ids would not sort after the old ones (read in layout {}, {max} is dated {date}); renumber the old ids below it, or use a layout whose ids are already larger (an earlier epoch) in a deployment of its own",
        topo.layout().name()
    ))
}

/// The statements of one switch, after the lock and the floor check.
fn switch_sql(topo: &Topology, shard: u64, t: &str, column: &str, col: &Column) -> Vec<String> {
    let mut out = Vec::new();
    if col.identity
        && let Some(seq) = &col.sequence
    {
        let kept = kept_identity_sequence(seq);
        out.push(format!("CREATE SEQUENCE IF NOT EXISTS {kept} AS bigint"));
        out.push(format!(
            "SELECT setval('{kept}', last_value, is_called) FROM {seq}"
        ));
        out.push(format!(
            "ALTER TABLE {t} ALTER COLUMN {column} DROP IDENTITY"
        ));
    }
    out.push(format!(
        "ALTER TABLE {t} ALTER COLUMN {column} SET DEFAULT {}",
        sql::next_id_call(&topo.schema(shard))
    ));
    out
}

/// Where an identity column's sequence is kept (`DROP IDENTITY` drops it).
fn kept_identity_sequence(seq: &str) -> String {
    format!("{seq}_before_shardflake")
}

/// Switches one table: deployment lock, table lock (bounded), the floor
/// checked again, the statements of the plan, the record; one transaction.
///
/// `c` holds the deployment lock for the whole run (see [`adopt`]); the
/// transaction takes it again (a no-op for its holder) so that the
/// script `--dry-run` prints is whole on its own.
async fn switch(topo: &Topology, c: &mut Client, mut p: Adopted) -> Result<Adopted, Error> {
    let server = p.server.clone();
    let name = server.as_str();
    let tx = c.transaction().await.map_err(ctx(name, "begin"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&DEPLOYMENT_LOCK])
        .await
        .map_err(ctx(name, "taking the deployment lock"))?;
    let t = p.table.clone();
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'; LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE"
    ))
    .await
    .map_err(ctx(
        name,
        &format!("locking {t} ({t} was not changed; run pg adopt again when its long transactions have ended)"),
    ))?;
    // Planned before these locks: another adopt (from another machine)
    // may have switched it since, or someone changed it.
    let now = tx
        .query_one(
            "SELECT a.attidentity <> '', pg_get_expr(d.adbin, d.adrelid)
               FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
              WHERE a.attrelid = to_regclass($1) AND a.attname = $2",
            &[&t, &p.column],
        )
        .await
        .map_err(ctx(name, &format!("reading {t}.{}", p.column)))?;
    let (identity, default): (bool, Option<String>) = (now.get(0), now.get(1));
    let call = sql::next_id_call(&topo.schema(p.shard));
    if default.as_deref() == Some(call.as_str()) {
        p.unchanged = true;
        p.sql.clear();
        if let Some(r) = tx
            .query_opt(
                "SELECT floor_id, old_sequence FROM shardflake.adopted WHERE tbl = $1 AND col = $2",
                &[&t, &p.column],
            )
            .await
            .map_err(ctx(name, "reading the adopted table's record"))?
        {
            (p.floor, p.old_sequence) = (r.get(0), r.get(1));
        }
        return Ok(p);
    }
    let planned_identity = p.sql.iter().any(|s| s.ends_with("DROP IDENTITY"));
    if identity != planned_identity {
        return Err(refused(
            "adopt",
            vec![Drift {
                server: name.into(),
                shard: Some(p.shard),
                problem: format!(
                    "{t}.{} changed while adopt was planning (identity {}): it was not changed; run pg adopt again",
                    p.column,
                    if identity { "added" } else { "dropped" }
                ),
            }],
        ));
    }
    tx.batch_execute(&format!("{ADOPTED_DDL};\n{DECODE_DDL}"))
        .await
        .map_err(ctx(name, "creating shardflake.adopted"))?;
    let col = &p.column;
    let max: Option<i64> = tx
        .query_one(&format!("SELECT max({col}) FROM {t}"), &[])
        .await
        .map_err(ctx(name, &format!("reading max({col}) of {t}")))?
        .get(0);
    // Adopted before, and changed back by hand since: the ids drawn from
    // the old sequence meanwhile are old ids too, the new ones are not.
    let recorded: Option<(i64, Option<i64>)> = tx
        .query_opt(
            "SELECT first_new, floor_id FROM shardflake.adopted WHERE tbl = $1 AND col = $2",
            &[&t, col],
        )
        .await
        .map_err(ctx(name, "reading the adopted table's record"))?
        .map(|r| (r.get(0), r.get(1)));
    let floor: Option<i64> = match recorded {
        None => max,
        Some((first, _)) => tx
            .query_one(
                &format!("SELECT max({col}) FROM {t} WHERE {col} < $1"),
                &[&first],
            )
            .await
            .map_err(ctx(name, &format!("reading the old ids of {t}")))?
            .get(0),
    };
    // The record of an earlier adoption remembers old ids that a restore
    // of the table alone (its dump from before adoption) threw away: they
    // stay old ids, and the kept sequence is moved past them below.
    let floor = floor.max(recorded.and_then(|(_, f)| f));
    let first = first_new_id(&tx, topo, name, p.shard).await?;
    if let Some(problem) = too_high(topo, &t, &p.column, max, first) {
        return Err(refused(
            "adopt",
            vec![Drift {
                server: name.into(),
                shard: Some(p.shard),
                problem,
            }],
        ));
    }
    let old_default: String = tx
        .query_one(
            "SELECT coalesce(pg_get_expr(d.adbin, d.adrelid), 'identity')
               FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
              WHERE a.attrelid = to_regclass($1) AND a.attname = $2",
            &[&t, &p.column],
        )
        .await
        .map_err(ctx(name, "reading the column's default"))?
        .get(0);
    for stmt in &p.sql {
        tx.batch_execute(stmt)
            .await
            .map_err(ctx(name, &format!("running {stmt}")))?;
    }
    let kept = if p.sql.iter().any(|s| s.ends_with("DROP IDENTITY")) {
        p.old_sequence.as_deref().map(kept_identity_sequence)
    } else {
        p.old_sequence.clone()
    };
    // The kept sequence past every old id, not even those a restore of
    // the table set it back below handed out again. Unfenced first: old
    // ids may have been stored past an earlier fence by hand.
    if let Some(seq) = &kept {
        tx.batch_execute(&format!("ALTER SEQUENCE {seq} NO MAXVALUE"))
            .await
            .map_err(ctx(name, &format!("unfencing {seq}")))?;
    }
    if let (Some(seq), Some(floor)) = (&kept, floor) {
        tx.execute(
            "SELECT setval($1::text::regclass, $2) WHERE $2 > coalesce(pg_sequence_last_value($1::text::regclass), 0)",
            &[seq, &floor],
        )
        .await
        .map_err(ctx(name, &format!("moving {seq} past the old ids")))?;
    }
    if let Some(seq) = &kept {
        fence(&tx, name, seq).await?;
    }
    tx.execute(
        "INSERT INTO shardflake.adopted (tbl, col, shard, floor_id, first_new, old_default, old_sequence)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (tbl, col) DO UPDATE SET shard = EXCLUDED.shard, floor_id = EXCLUDED.floor_id,
           old_sequence = coalesce(adopted.old_sequence, EXCLUDED.old_sequence), adopted_at = now()",
        &[
            &t,
            &p.column,
            &(p.shard as i64),
            &floor,
            &first,
            &old_default,
            &kept,
        ],
    )
    .await
    .map_err(ctx(name, "recording the adopted table"))?;
    tx.commit().await.map_err(ctx(name, "commit"))?;
    p.floor = floor;
    p.old_sequence = kept;
    tracing::debug!(server = name, table = t.as_str(), shard = p.shard, floor = ?floor, "adopted");
    Ok(p)
}

/// Fences the kept sequence `seq` at its value (`MAXVALUE`, marked
/// called, `NO CYCLE`: a cycling sequence at its `MAXVALUE` starts again
/// at its `MINVALUE`, old id 1): every `nextval()` on it (a default put
/// back by hand, which `pg check` reports, a function, a trigger, the
/// application's own) then fails ("reached maximum value") instead of
/// handing out ids that sort before the new ones, or, once a restore of
/// the table threw rows away without adopt seeing them, ids handed out
/// before. A restore of
/// the table's dump from before adoption brings the sequence back
/// unfenced; adopt, run again, fences it again. Left unfenced, with a
/// warning, while another column's default still draws from it (a
/// sequence shared by tables): fencing it would fail that table's
/// inserts; adopting that table too fences it.
async fn fence(tx: &impl GenericClient, name: &str, seq: &str) -> Result<(), Error> {
    let Some((value, min)) = to_fence(tx, name, seq, true).await? else {
        return Ok(());
    };
    tx.batch_execute(&format!(
        "ALTER SEQUENCE {seq} NO CYCLE MINVALUE {min} MAXVALUE {value}"
    ))
    .await
    .map_err(ctx(name, &format!("fencing {seq} at {value}")))?;
    tx.execute(
        "SELECT setval($1::text::regclass, $2, true)",
        &[&seq, &value],
    )
    .await
    .map_err(ctx(name, &format!("fencing {seq} at {value}")))?;
    Ok(())
}

/// The `(MAXVALUE, MINVALUE)` that [`fence`] would give the kept sequence
/// `seq`; none when it is gone, already fenced, or still drawn from by
/// another column's default (logged when `warn`).
async fn to_fence(
    tx: &impl GenericClient,
    name: &str,
    seq: &str,
    warn: bool,
) -> Result<Option<(i64, i64)>, Error> {
    // Dropped by the operator: nothing left to fence.
    let exists: bool = tx
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&seq])
        .await
        .map_err(ctx(name, &format!("looking up {seq}")))?
        .get(0);
    if !exists {
        return Ok(None);
    }
    let users: Vec<String> = tx
        .query(
            "SELECT pg_describe_object(classid, objid, objsubid) FROM pg_depend
              WHERE classid = 'pg_attrdef'::regclass AND refclassid = 'pg_class'::regclass
                AND refobjid = to_regclass($1) ORDER BY 1",
            &[&seq],
        )
        .await
        .map_err(ctx(name, &format!("reading what draws from {seq}")))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if !users.is_empty() {
        if warn {
            tracing::warn!(
                server = name,
                "{seq} is left unfenced: {} still draw(s) from it; adopt those tables too",
                users.join(", ")
            );
        }
        return Ok(None);
    }
    // MINVALUE must stay below MAXVALUE (a sequence never drawn from is
    // at its MINVALUE).
    let Some(row) = tx
        .query_opt(
            &format!(
                "SELECT greatest(s.last_value, q.seqmin), least(q.seqmin, greatest(s.last_value, q.seqmin) - 1),
                        s.is_called AND q.seqmax <= s.last_value AND NOT q.seqcycle
                   FROM {seq} s, pg_sequence q WHERE q.seqrelid = to_regclass($1)"
            ),
            &[&seq],
        )
        .await
        .map_err(ctx(name, &format!("reading {seq}")))?
    else {
        return Ok(None);
    };
    let (value, min, fenced): (i64, i64, bool) = (row.get(0), row.get(1), row.get(2));
    Ok((!fenced).then_some((value, min)))
}

/// The adopted tables of every server of the file (unreachable servers
/// are skipped: `pg check` reports them).
pub async fn adopted(topo: &Topology) -> Result<Vec<AdoptedTable>, Error> {
    let mut out = Vec::new();
    for server in topo.servers() {
        if let Ok(c) = connect(server).await {
            out.extend(records(&c, &server.name).await?);
        }
    }
    Ok(out)
}

/// Why `shard` cannot move off `server`: objects outside its schema
/// depend on it (`pg_depend` on its functions, sequences, tables and
/// types): adopted tables, a default set by hand to its `next_id`, a view,
/// a foreign key to one of its tables. They stay on `server`, and
/// dropping the old copy (`DROP SCHEMA ... CASCADE`) would drop them with
/// it: the table's inserts would then fail.
pub(crate) async fn shard_dependents(
    c: &Client,
    server: &str,
    shard: u64,
    schema: &str,
) -> Result<Option<String>, Error> {
    let adopted: Vec<String> = records(c, server)
        .await?
        .into_iter()
        .filter(|r| r.shard == shard)
        .map(|r| format!("{}.{}", r.table, r.column))
        .collect();
    // Each dependent object with the schema it lives in (a default, a
    // view's rule, a constraint or a trigger: its table's), and, for a
    // column's default, the column (an adopted table is named above).
    let rows = c
        .query(
            "WITH s AS (SELECT oid FROM pg_namespace WHERE nspname = $1),
                  owned AS (
                    SELECT 'pg_class'::regclass AS classid, c.oid FROM pg_class c, s WHERE c.relnamespace = s.oid
                    UNION ALL SELECT 'pg_proc'::regclass, p.oid FROM pg_proc p, s WHERE p.pronamespace = s.oid
                    UNION ALL SELECT 'pg_type'::regclass, t.oid FROM pg_type t, s WHERE t.typnamespace = s.oid),
                  dep AS (
                    SELECT DISTINCT d.classid, d.objid, d.objsubid
                      FROM pg_depend d JOIN owned o ON d.refclassid = o.classid AND d.refobjid = o.oid
                     WHERE d.deptype IN ('n', 'a'))
             SELECT pg_describe_object(dep.classid, dep.objid, dep.objsubid),
                    (SELECT format('%I.%I.%I', n.nspname, r.relname, a.attname)
                       FROM pg_attrdef ad JOIN pg_class r ON r.oid = ad.adrelid
                       JOIN pg_namespace n ON n.oid = r.relnamespace
                       JOIN pg_attribute a ON a.attrelid = ad.adrelid AND a.attnum = ad.adnum
                      WHERE dep.classid = 'pg_attrdef'::regclass AND ad.oid = dep.objid)
               FROM dep, s
              WHERE coalesce(CASE dep.classid
                      WHEN 'pg_class'::regclass THEN (SELECT relnamespace FROM pg_class WHERE oid = dep.objid)
                      WHEN 'pg_proc'::regclass THEN (SELECT pronamespace FROM pg_proc WHERE oid = dep.objid)
                      WHEN 'pg_type'::regclass THEN (SELECT typnamespace FROM pg_type WHERE oid = dep.objid)
                      WHEN 'pg_constraint'::regclass THEN (SELECT connamespace FROM pg_constraint WHERE oid = dep.objid)
                      WHEN 'pg_attrdef'::regclass THEN (SELECT r.relnamespace FROM pg_attrdef x JOIN pg_class r ON r.oid = x.adrelid WHERE x.oid = dep.objid)
                      WHEN 'pg_rewrite'::regclass THEN (SELECT r.relnamespace FROM pg_rewrite x JOIN pg_class r ON r.oid = x.ev_class WHERE x.oid = dep.objid)
                      WHEN 'pg_trigger'::regclass THEN (SELECT r.relnamespace FROM pg_trigger x JOIN pg_class r ON r.oid = x.tgrelid WHERE x.oid = dep.objid)
                      WHEN 'pg_policy'::regclass THEN (SELECT r.relnamespace FROM pg_policy x JOIN pg_class r ON r.oid = x.polrelid WHERE x.oid = dep.objid)
                    END, 0) <> s.oid
              ORDER BY 1",
            &[&schema],
        )
        .await
        .map_err(ctx(server, &format!("reading what depends on schema {schema}")))?;
    let others: Vec<String> = rows
        .iter()
        .filter(|r| {
            let column: Option<String> = r.get(1);
            column.is_none_or(|col| !adopted.contains(&col))
        })
        .map(|r| r.get(0))
        .collect();
    let mut problems = Vec::new();
    if !adopted.is_empty() {
        problems.push(format!(
            "adopted tables on {server} draw their ids from shard {shard} ({}), and stay on {server}: move another shard, or first adopt them onto another shard of {server} (shardflake pg adopt --table T --shard N)",
            adopted.join(", ")
        ));
    }
    if !others.is_empty() {
        problems.push(format!(
            "objects outside schema {schema} on {server} depend on shard {shard} ({}), and stay on {server}: moving it would drop them with its old copy; move another shard, or first make them use another shard of {server} (a default: shardflake pg adopt --table T --shard N, or change the default; a view or foreign key: drop or recreate it)",
            others.join(", ")
        ));
    }
    Ok((!problems.is_empty()).then(|| problems.join("; ")))
}

/// What `pg check` reports of a server's adopted tables: a default that no
/// longer calls its shard's `next_id` (changed back by hand), a table
/// gone, a shard the file no longer puts on this server.
pub(crate) async fn drift(
    c: &Client,
    topo: &Topology,
    server: &Server,
) -> Result<Vec<Drift>, Error> {
    let mut out = Vec::new();
    for r in records(c, &server.name).await? {
        let d = |problem| Drift {
            server: server.name.clone(),
            shard: Some(r.shard),
            problem,
        };
        let call = sql::next_id_call(&topo.schema(r.shard));
        if !server.shards.contains(&r.shard) {
            out.push(d(format!(
                "adopted table {} draws from shard {}, which the file puts on another server: its inserts fail (SF001); move the shard back (pg move-shard {} --to {})",
                r.table, r.shard, r.shard, server.name
            )));
        } else if r.default.is_none() && !relation_exists(c, &server.name, &r.table).await? {
            out.push(d(format!(
                "adopted table {} is gone: remove its record (DELETE FROM shardflake.adopted WHERE tbl = '{}')",
                r.table, r.table
            )));
        } else if r.default.as_deref() != Some(call.as_str()) {
            out.push(d(format!(
                "adopted table {}.{} no longer draws from shard {} (its default is {}; changed back by hand?): its inserts fail on the kept sequence, fenced at adoption, or, after a restore of the table, draw from a sequence that repeats ids; run shardflake pg adopt --table {} --shard {} again",
                r.table,
                r.column,
                r.shard,
                r.default.as_deref().unwrap_or("none"),
                r.table,
                r.shard
            )));
        } else if let Some(p) = no_unique_index(c, &server.name, &r.table, &r.column).await? {
            out.push(d(format!("adopted table {p}")));
        } else if let Some(seq) = &r.old_sequence
            && to_fence(c, &server.name, seq, false).await?.is_some()
        {
            out.push(d(format!(
                "the sequence {seq} kept for adopted table {}.{} is not fenced (adopted by an earlier version, or changed by hand since): a default or a function drawing from it would hand out ids again; run shardflake pg adopt --table {} --shard {} (it fences it)",
                r.table, r.column, r.table, r.shard
            )));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nextval_defaults_name_their_sequence() {
        assert_eq!(
            nextval_of("nextval('orders_id_seq'::regclass)").as_deref(),
            Some("orders_id_seq")
        );
        assert_eq!(
            nextval_of("nextval('app.\"Odd\"''s'::regclass)").as_deref(),
            Some("app.\"Odd\"'s")
        );
        assert_eq!(nextval_of("now()"), None);
        assert_eq!(nextval_of("nextval('a'::regclass) + 1"), None);
    }

    #[test]
    fn encode_matches_the_core_layout() {
        let topo = Topology::parse(
            "layout = \"instagram\"\nshards = 8\n[[servers]]\nname = \"a\"\nurl = \"postgres://x@127.0.0.1/db\"\nshards = \"0-7\"\n",
        )
        .unwrap();
        // tick 5, sequence 3 on shard 6: 5 << 23 | 6 << 10 | 3
        assert_eq!(encode(&topo, 6, (5 << 10) | 3), (5 << 23) | (6 << 10) | 3);
        assert!(negative_ids(&topo).is_none());
        let allow = Topology::parse(
            "layout = \"instagram\"\nshards = 8\nsign_bit = \"allow\"\n[[servers]]\nname = \"a\"\nurl = \"postgres://x@127.0.0.1/db\"\nshards = \"0-7\"\n",
        )
        .unwrap();
        let p = negative_ids(&allow).unwrap();
        assert!(
            p.contains("2046-06-27") && p.contains("sign_bit = \"refuse\""),
            "{p}"
        );
    }
}
