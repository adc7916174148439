//! `mysql apply`: install the one-statement ids and the procedures.

use super::*;

/// What `apply` did.
#[derive(Debug, Clone, Default)]
pub struct Applied {
    /// Objects created or replaced, in order (`sequence posts_id_seq`, ...).
    pub installed: Vec<String>,
    /// Settings that weaken a guarantee, or that must also go into the
    /// server's configuration.
    pub warnings: Vec<String>,
    /// The clock event was seen running before `apply` returned.
    pub clock_running: bool,
    /// The procedure to call: `generate_post_id`, or on a server without
    /// sequences the row-lock one.
    pub procedure: String,
    /// Whether the one-statement ids (trigger, sequence, clock event) are
    /// installed (not on a server without sequences).
    pub one_statement: bool,
    /// `mysql adopt`: the largest old id (none in an empty table) and the
    /// smallest id the trigger can make, read under the table's lock.
    pub(super) switched: Option<(Option<i64>, i64)>,
    /// `mysql adopt`: the switch found the table already switched, with
    /// its record (another run adopted it meanwhile), and changed nothing.
    pub(super) switched_before: bool,
}

/// Why [`install`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// `mysql apply`.
    Apply,
    /// `mysql repair`: also over objects installed for another
    /// `server_id` (it has put the sequence past the old primary's ids
    /// first).
    Repair,
    /// `mysql adopt`: the clock event first (running before any insert
    /// meets the trigger), then the table switched under `LOCK TABLES`
    /// ([`super::adopt`]).
    Adopt,
}

/// Installs, idempotently, on the database the connection uses: the
/// sequence (created at the server's packed clock; an existing one keeps
/// its position, gets the options the no-repeat argument needs, and is
/// caught up with the clock), the table if missing (an existing one keeps
/// its columns; an `id` with neither `AUTO_INCREMENT` nor a default gets
/// `DEFAULT 0`), the refusal function and the trigger (replaced in one
/// statement, only when they differ, so a re-run takes no table lock), the
/// clock event (a running loop with an older body is stopped; the scheduler
/// starts the new one within a second), `generate_post_id`, and with
/// [`Options::locked`] the row-lock procedure, with [`Options::seed`] the
/// seed's. Without sequences (MySQL) it installs only the row-lock
/// procedure. Refuses a server clock outside the layout, a sequence made
/// for another layout or already past it, an `id` column that is not a
/// signed `BIGINT`, an event scheduler it cannot turn on, and a server
/// clock more than [`crate::CLOCK_BOUND_MS`] from this host's; warns
/// about `innodb_flush_log_at_trx_commit = 0`. With [`Options::peers`],
/// the sequence goes past every peer's (so ids of shard values taken from
/// a peer sort after those it made), refusing a peer's further ahead of
/// this server's clock than a draw may run.
///
/// The trigger and the procedure make ids only on the server they were
/// installed on (its `@@server_id`): on a promoted replica every insert is
/// refused until `mysql repair`, and `apply` refuses it too.
pub async fn apply(conn: &mut Conn, layout: &Layout, opts: &Options) -> Result<Applied, Error> {
    install(conn, layout, opts, Mode::Apply).await
}

impl Mode {
    /// The command, as its refusals name it.
    pub(super) fn command(self) -> &'static str {
        match self {
            Mode::Apply => "apply",
            Mode::Repair => "repair",
            Mode::Adopt => "adopt",
        }
    }
}

/// [`apply`], [`super::repair`]'s reinstall or [`super::adopt`]'s switch,
/// under the table's deployment lock on this server and every peer
/// ([`DeploymentLock`]; `repair` holds it already).
pub(super) async fn install(
    conn: &mut Conn,
    layout: &Layout,
    opts: &Options,
    mode: Mode,
) -> Result<Applied, Error> {
    if mode == Mode::Repair {
        return install_locked_deployment(conn, layout, opts, mode).await;
    }
    let lock = DeploymentLock::take(conn, &opts.peers, &opts.names, mode.command()).await?;
    let result = install_locked_deployment(conn, layout, opts, mode).await;
    lock.release(conn).await;
    result
}

/// What every check before a change found, for the change
/// ([`install_locked_deployment`]) or a dry run that stops there
/// (`adopt --dry-run`).
pub(super) struct Preflight {
    srv: Server,
    db: String,
    plan: Plan,
    serves: (u64, u64),
    peers: PeersPast,
}

/// Refuses a shard range that is not one within the layout's values.
pub(super) fn check_range(
    cmd: &str,
    layout: &Layout,
    plan: &Plan,
    (lo, hi): (u64, u64),
) -> Result<(), Error> {
    if lo > hi || hi > plan.shard_max() {
        return Err(other(
            cmd,
            format!(
                "shard values {lo}-{hi} are not a range within 0-{} (the key mod {} of layout {})",
                plan.shard_max(),
                plan.shard_max() + 1,
                layout.name()
            ),
        ));
    }
    Ok(())
}

/// Every check `apply`, `repair`'s reinstall and `adopt` make before
/// any change, under the deployment lock; a dry run runs them all.
pub(super) async fn preflight(
    conn: &mut Conn,
    layout: &Layout,
    opts: &Options,
    mode: Mode,
) -> Result<Preflight, Error> {
    let cmd = mode.command();
    let srv = server(conn).await?;
    let db = srv.named_database(cmd)?;
    let recorded = recorded_serves(conn, &db, &opts.names).await?;
    let plan = plan_in(layout, &db, &opts.names)?
        .on_server(srv.server_id)
        .at(srv.port, &srv.datadir);
    let plan = if srv.has_sequences() {
        plan
    } else {
        plan.without_clock_loop()
    };
    // A record, yet no sequence of the table here (the record is written
    // only once the sequence is): the database or the table's objects
    // were dropped, and this one made anew under the same name. The
    // dropped one's ids come back with its backup, so its values stay
    // taken until its record is deleted by name (review E4: a plain or
    // `--new-deployment` apply here took them over or freed them).
    if mode != Mode::Repair
        && let Some((lo, hi)) = recorded
        && sequence_kind(conn, &opts.names.sequence()).await?.is_none()
    {
        return Err(other(cmd, dropped_record_text(&db, &opts.names, (lo, hi))));
    }
    let serves = opts.shards.or(recorded).unwrap_or((0, plan.shard_max()));
    check_range(cmd, layout, &plan, serves)?;
    let mut overlaps = overlapping_peers(conn, cmd, &opts.peers, &opts.names, serves).await?;
    // Every other database of this server is a peer too, on every
    // command that records values (`--new-deployment`: a deployment of
    // its own, by the operator's word).
    if !opts.new_deployment {
        overlaps.extend(
            this_servers_other_databases(
                conn,
                &db,
                &opts.names,
                serves,
                (0, plan.shard_max()),
                false,
            )
            .await?,
        );
    }
    if !overlaps.is_empty() {
        return Err(other(
            cmd,
            format!("nothing was changed: {}", overlaps.join("; ")),
        ));
    }
    // Installed here, yet no record of its shard values: the database
    // alone copied from another server, which may still make ids for all
    // of them. Which ones this server takes is the operator's word.
    if mode == Mode::Apply
        && recorded.is_none()
        && opts.shards.is_none()
        && !opts.new_deployment
        && installed_server_id(conn, &opts.names).await?.is_some()
    {
        return Err(other(
            cmd,
            no_record_text(&db, &opts.names, "apply", plan.shard_max()),
        ));
    }
    let plan = plan.serving(Some(serves));
    let was = installed_for(conn, &opts.names)
        .await?
        .filter(|w| !w.is(srv.server_id, srv.port, &srv.datadir));
    // This table's objects are this server's (or none): another table's
    // made for another server make this server a copy all the same.
    let copied = match (&was, mode) {
        (None, Mode::Apply | Mode::Adopt) => copied_server(conn, &srv).await?,
        _ => None,
    };
    if mode != Mode::Repair {
        let either = was.as_ref().or(copied.as_ref().map(|(_, w)| w));
        nothing_to_prove(cmd, opts, either, &srv)?;
    }
    if mode != Mode::Repair
        && let Some(was) = &was
        && was.server_id != srv.server_id
    {
        return Err(other(
            cmd,
            other_server_text(&opts.names, was, srv.server_id),
        ));
    }
    // A record made on another server: this one may be a copy of it, and
    // which values it makes ids for is the operator's word (`--shards`).
    // (`repair`, the step after a promotion or a restore, records it.)
    if mode != Mode::Repair
        && opts.shards.is_none()
        && let Some((recorded_at, here)) = recorded_elsewhere(conn, &db, &opts.names).await?
    {
        return Err(other(
            cmd,
            format!(
                "nothing was changed: {}",
                copy_text(&db, &opts.names, serves, &recorded_at, &here, was.as_ref())
            ),
        ));
    }
    // The objects made for another port or data directory (a copy of the
    // server beside it, or the server moved): values of its own only
    // with the original named as a peer, or on the word that it is gone.
    if mode != Mode::Repair
        && let Some(was) = &was
    {
        old_server_proven_gone(cmd, opts, was, None, &srv).await?;
    }
    if let Some((table, was)) = &copied {
        old_server_proven_gone(cmd, opts, was, Some(table), &srv).await?;
    }
    if mode != Mode::Repair {
        // Where its clock is off, ids of shard values it takes from a peer
        // or after a failover cannot be put past the others' (repair
        // checks for itself).
        let (offset, uncertainty) = clock_offset(conn).await?;
        if let Some(problem) = crate::clock_problem(offset, uncertainty, "mysql apply") {
            return Err(other(cmd, format!("nothing was changed: {problem}")));
        }
    }
    // Shard values taken from a peer, or from another database of this
    // server: the peer made ids for them up to its sequence, by its own
    // clock; this server's ids for them must sort after those, whatever
    // its clock. So its sequence goes past every peer's reservation,
    // which must be within a draw's lead of its clock (a draw further
    // ahead waits, or is refused).
    let mut peers = peers_past(cmd, &opts.peers, &opts.names).await?;
    if !opts.new_deployment {
        past_of(conn, "this server", Some(&db), &opts.names, &mut peers).await?;
    }
    if let Some((past, url)) = &peers.reservation {
        let now = server_packed_clock(conn, &plan).await?;
        if *past - now > plan.packed_ms(sql::AHEAD_MS) {
            let ahead_ms = (*past - now) / plan.per_tick() * layout.tick_ms() as i64;
            return Err(other(
                cmd,
                format!(
                    "nothing was changed: peer {url} has handed out values of {seq} up to {:.3} s ahead of this server's clock, more than the {} ms a draw may run ahead: the ids this server makes for shard values the peer made ids for must sort after the peer's, and would be refused or wait; correct the clock (NTP) of whichever server is wrong (shardflake mysql check on each names it), then run shardflake mysql {cmd} again",
                    ahead_ms as f64 / 1000.0,
                    sql::AHEAD_MS,
                    seq = opts.names.sequence()
                ),
            ));
        }
    }
    Ok(Preflight {
        srv,
        db,
        plan,
        serves,
        peers,
    })
}

/// Why a database whose record outlived its sequence ([`preflight`]) is
/// refused, and the two ways out.
fn dropped_record_text(db: &str, names: &Names, (lo, hi): (u64, u64)) -> String {
    format!(
        "nothing was changed: this server records (shardflake.serves) that {db}.{table} makes ids for shard values {lo}-{hi}, but {db} has no sequence {seq}: that database (or the table's objects) was dropped, and this {db} is another made under the same name. The dropped one's ids come back with its backup, so its values stay taken until its record is deleted: restore that backup here, then run shardflake mysql repair; or, if it will not come back, release them: DELETE FROM shardflake.serves WHERE db = '{db_lit}' AND tbl = '{table}', then run this command again",
        table = names.table,
        seq = names.sequence(),
        db_lit = db.replace('\'', "''"),
    )
}

/// Refuses `--old-server-gone` where the objects were installed for this
/// server (or are not installed): there is no other server whose ids
/// would be taken over, and a flag that proves something is never
/// ignored (review: `--old-server-gone x` was accepted and did nothing).
pub(super) fn nothing_to_prove(
    cmd: &str,
    opts: &Options,
    was: Option<&InstalledFor>,
    srv: &Server,
) -> Result<(), Error> {
    match (&opts.old_server_gone, was) {
        (Some(named), None) => Err(other(
            cmd,
            format!(
                "nothing was changed: --old-server-gone {named}: the ids of {table} here were installed for this server ({}:{}:{}), or are not installed: this server's ids were installed for it, so there is no other server's to take over and nothing to prove; run shardflake mysql {cmd} without --old-server-gone",
                srv.server_id,
                srv.port,
                srv.datadir,
                table = opts.names.table
            ),
        )),
        _ => Ok(()),
    }
}

async fn install_locked_deployment(
    conn: &mut Conn,
    layout: &Layout,
    opts: &Options,
    mode: Mode,
) -> Result<Applied, Error> {
    let cmd = mode.command();
    let Preflight {
        srv,
        db,
        plan,
        serves,
        peers,
    } = preflight(conn, layout, opts, mode).await?;
    let old_mode: String = conn
        .query_first("SELECT @@SESSION.sql_mode")
        .await
        .map_err(my("reading sql_mode"))?
        .unwrap_or_default();
    // A change to the table, its sequence or its trigger waits for every
    // open transaction that used them (their metadata lock), and every
    // insert waits behind that change; the row-lock counter's row waits
    // for a transaction that called generate_post_id_locked (an InnoDB
    // row lock, `innodb_lock_wait_timeout`, 50 s by default). Both waits
    // are bounded, and named when they run out.
    let old_wait: Option<(u64, u64)> = conn
        .query_first("SELECT @@SESSION.lock_wait_timeout, @@SESSION.innodb_lock_wait_timeout")
        .await
        .map_err(my("reading lock_wait_timeout"))?;
    conn.query_drop(format!(
        "SET SESSION sql_mode = '{}', SESSION lock_wait_timeout = {TABLE_LOCK_WAIT_S}, SESSION innodb_lock_wait_timeout = {TABLE_LOCK_WAIT_S}",
        sql::SQL_MODE
    ))
    .await
    .map_err(my("setting sql_mode"))?;
    let mut result = async {
        // The same for the row-lock procedure's counter: past every
        // peer's, before its procedure takes the peer's values.
        if (opts.locked || !srv.has_sequences())
            && let Some(past) = peers.locked_counter
        {
            conn.query_drop(sql::sequences_sql(&opts.names.locked_row()))
                .await
                .map_err(my(ROW_LOCK_COUNTER))?;
            conn.exec_drop(
                "UPDATE sequences SET next_val = GREATEST(next_val, ?) WHERE name = ?",
                (past, opts.names.locked_row()),
            )
            .await
            .map_err(my(ROW_LOCK_COUNTER))?;
        }
        apply_pinned(
            conn,
            &plan,
            opts,
            &srv,
            mode,
            peers.reservation.map(|p| p.0),
        )
        .await
    }
    .await;
    if result.is_ok() && srv.has_sequences() {
        record_serves(conn, &db, &opts.names, serves).await?;
        if opts.new_deployment {
            record_separate(conn, &db, &opts.names).await?;
        }
    }
    if let Err(e) = &result
        && lock_wait_ran_out(e)
    {
        let changed = format!(
            "stopped before changing table {} (what it changed before that is kept, and the command run again goes on from there)",
            opts.names.table
        );
        result = Err(other(
            cmd,
            open_transactions_text(conn, &opts.names, cmd, &changed, lock_was_a_row(e)).await,
        ));
    }
    let (old_wait, old_row_wait) = old_wait.unwrap_or((31_536_000, 50));
    conn.exec_drop(
        "SET SESSION sql_mode = ?, SESSION lock_wait_timeout = ?, SESSION innodb_lock_wait_timeout = ?",
        (old_mode, old_wait, old_row_wait),
    )
    .await
    .map_err(my("restoring sql_mode"))?;
    result
}

/// Why a server that writes a binary log (every replication primary) will
/// not let this user create the function and trigger `apply` must create,
/// if it will not: there MariaDB lets only a user with `SUPER` create a
/// function or a trigger, unless `log_bin_trust_function_creators` is on.
/// Asked before anything changes, since the server's error would come
/// halfway (after the sequence and the table). The function's `READS SQL
/// DATA` answers the other rule of such a server (`ERROR 1418`).
async fn binlog_refusal(
    conn: &mut Conn,
    plan: &Plan,
    names: &Names,
) -> Result<Option<String>, Error> {
    let row: Option<(i64, i64, String, i64)> = conn
        .query_first(
            r#"SELECT @@GLOBAL.log_bin, @@GLOBAL.log_bin_trust_function_creators, CURRENT_USER(),
                    EXISTS (SELECT 1 FROM information_schema.USER_PRIVILEGES
                             WHERE PRIVILEGE_TYPE = 'SUPER'
                               AND (GRANTEE = CONCAT('''', SUBSTRING_INDEX(CURRENT_USER(), '@', 1), '''@''',
                                                     SUBSTRING_INDEX(CURRENT_USER(), '@', -1), '''')
                                    OR GRANTEE IN (SELECT CONCAT('''', ROLE_NAME, '''')
                                                     FROM information_schema.ENABLED_ROLES)))"#,
        )
        .await
        .map_err(my("reading log_bin and log_bin_trust_function_creators"))?;
    let Some((log_bin, trusted, user, has_super)) = row else {
        return Ok(None);
    };
    if log_bin == 0 || trusted != 0 || has_super != 0 {
        return Ok(None);
    }
    let function = sql::refused_function_sql(plan, names);
    let trigger = sql::trigger_sql(plan, names);
    if !routine_differs(conn, &names.refused_function(), "FUNCTION", &function).await?
        && !trigger_differs(conn, names, &trigger).await?
    {
        return Ok(None);
    }
    Ok(Some(format!(
        "the server writes a binary log (log_bin = ON) with log_bin_trust_function_creators = OFF, so only a user with the SUPER privilege may create the function {} and the trigger {}, and {user} has not; nothing was changed. SET GLOBAL log_bin_trust_function_creators = ON (and put it in the server's configuration), or run apply as a user with SUPER",
        names.refused_function(),
        names.trigger()
    )))
}

pub(super) async fn apply_pinned(
    conn: &mut Conn,
    plan: &Plan,
    opts: &Options,
    srv: &Server,
    mode: Mode,
    peers_past: Option<i64>,
) -> Result<Applied, Error> {
    let names = &opts.names;
    let mut applied = Applied {
        procedure: names.locked_procedure(),
        ..Applied::default()
    };
    if !srv.has_sequences() {
        applied.warnings.push(format!(
            "{} has no sequences (MariaDB >= 10.3 has): installed only {}, the row-lock procedure",
            srv.version,
            names.locked_procedure()
        ));
        if install_locked(conn, plan, names, srv.mariadb).await? {
            applied.installed.push(names.locked_procedure());
        }
        if opts.seed && install_seed(conn, names, srv.mariadb).await? {
            applied.installed.push(names.seed_procedure());
        }
        return Ok(applied);
    }
    if let Some(why) = binlog_refusal(conn, plan, names).await? {
        return Err(other(mode.command(), why));
    }
    if srv.flush_log_at_trx_commit == 0 {
        applied.warnings.push(FLUSH_0.to_string());
    }
    match srv.event_scheduler.as_str() {
        "ON" => {}
        "DISABLED" => {
            return Err(other(
                mode.command(),
                "event_scheduler is DISABLED (set at server start): the clock event cannot run; start the server with event_scheduler=ON",
            ));
        }
        _ => {
            conn.query_drop("SET GLOBAL event_scheduler = ON")
                .await
                .map_err(my(
                    "turning the event scheduler on (SET GLOBAL event_scheduler = ON)",
                ))?;
            applied.warnings.push(
                "turned the event scheduler on; put event_scheduler=ON in the server's configuration, or it is off again after a restart".into(),
            );
        }
    }
    let now = server_packed_clock(conn, plan).await?;
    // The high-water, outside this database (see `Plan::high_water`).
    create_high_water(conn, plan, names).await?;
    // The sequence.
    let seq = names.sequence();
    let kind = sequence_kind(conn, &seq).await?;
    match kind {
        None => {
            conn.query_drop(sql::sequence_sql(plan, names, now, opts.cache))
                .await
                .map_err(my("creating the sequence"))?;
            applied.installed.push(format!("sequence {seq}"));
        }
        Some((kind, engine, comment)) => {
            if kind != "SEQUENCE" {
                return Err(other(
                    mode.command(),
                    format!("{seq} exists and is a {kind}, not a sequence"),
                ));
            }
            if !engine.eq_ignore_ascii_case("InnoDB") {
                return Err(other(
                    mode.command(),
                    format!(
                        "sequence {seq} uses engine {engine}; the crash argument needs InnoDB (its reservations go to InnoDB's log)"
                    ),
                ));
            }
            if layout_of(&comment) != Some(plan.layout().to_string()) {
                return Err(other(
                    mode.command(),
                    format!(
                        "sequence {seq} was made for another layout ({comment:?}); its values mean other times: refusing to reuse it for {}",
                        plan.layout()
                    ),
                ));
            }
            let fix = sequence_fixes(conn, plan, names, opts.cache).await?;
            if let Some(alter) = fix {
                conn.query_drop(alter)
                    .await
                    .map_err(my("setting the sequence's options"))?;
                applied.installed.push(format!("options of sequence {seq}"));
            }
            if let (r, Some(floor)) = reservation_and_floor(conn, plan, names).await?
                && r < floor
            {
                return Err(other(mode.command(), set_back_text(names, plan, r, floor)));
            }
            if comment != plan.marker() {
                conn.query_drop(format!(
                    "ALTER TABLE `{seq}` COMMENT = {}",
                    quote(&plan.marker())
                ))
                .await
                .map_err(my("marking the sequence"))?;
            }
        }
    }
    // Up with the clock now, so the first ids are dated now (SETVAL never
    // moves a sequence down).
    conn.query_drop(format!("DO SETVAL(`{seq}`, {now}, 0)"))
        .await
        .map_err(my("catching the sequence up with the clock"))?;
    // Past every value a peer handed out, before the trigger takes the
    // peer's shard values.
    if let Some(past) = peers_past {
        conn.query_drop(format!("DO SETVAL(`{seq}`, {past}, 0)"))
            .await
            .map_err(my("moving the sequence past the peers'"))?;
    }
    raise_floor(conn, plan, names).await?;
    // The table (the seed's shape, if missing); adopt switches its own
    // under a lock below.
    if mode != Mode::Adopt {
        install_table(conn, plan, names, &mut applied).await?;
    }
    let refused = sql::refused_function_sql(plan, names);
    if routine_differs(conn, &names.refused_function(), "FUNCTION", &refused).await? {
        conn.query_drop(&refused)
            .await
            .map_err(my("creating the refusal function"))?;
        applied.installed.push(names.refused_function());
    }
    for (name, create) in sql::time_functions_sql(plan)
        .into_iter()
        .chain([sql::decode_function_sql(plan)])
    {
        if routine_differs(conn, name, "FUNCTION", &create).await? {
            conn.query_drop(&create)
                .await
                .map_err(my("creating the ids-by-time functions"))?;
            applied.installed.push(name.to_string());
        }
    }
    if mode == Mode::Adopt {
        // Inserts meet the trigger only once its clock loop runs.
        install_event(conn, plan, names, &mut applied).await?;
        if !wait_clock(conn, names, Duration::from_secs(5)).await? {
            return Err(other(
                "adopt",
                format!(
                    "the clock event {} was not seen running within 3 s, so the trigger would refuse every insert; the table was not changed (is event_scheduler ON?); run shardflake mysql check",
                    names.event()
                ),
            ));
        }
        // The procedures before the switch: a run stopped after it has
        // nothing left to install but the parked counter.
        install_procedures(conn, plan, opts, &mut applied).await?;
        applied.switched = Some(super::adopt::switch(conn, plan, names, &mut applied).await?);
    } else {
        install_guard_and_trigger(conn, plan, names, &mut applied).await?;
        install_event(conn, plan, names, &mut applied).await?;
    }
    applied.clock_running = wait_clock(conn, names, Duration::from_secs(5)).await?;
    if !applied.clock_running {
        applied.warnings.push(format!(
            "the clock event {} was not seen running within 3 s",
            names.event()
        ));
    }
    applied.one_statement = true;
    applied.procedure = names.procedure.clone();
    if mode != Mode::Adopt {
        install_procedures(conn, plan, opts, &mut applied).await?;
    }
    Ok(applied)
}

/// The procedures: `generate_post_id` (or its name), with
/// [`Options::locked`] the row-lock one, with [`Options::seed`] the seed's.
async fn install_procedures(
    conn: &mut Conn,
    plan: &Plan,
    opts: &Options,
    applied: &mut Applied,
) -> Result<(), Error> {
    let names = &opts.names;
    if replace_procedure(
        conn,
        &names.procedure,
        &sql::procedure_sql(plan, names),
        true,
    )
    .await?
    {
        applied.installed.push(names.procedure.clone());
    }
    if opts.locked && install_locked(conn, plan, names, true).await? {
        applied.installed.push(names.locked_procedure());
    }
    if opts.seed && install_seed(conn, names, true).await? {
        applied.installed.push(names.seed_procedure());
    }
    Ok(())
}

/// An `ALTER SEQUENCE` giving the options the argument needs, if any
/// differ; refuses a sequence already past the layout.
pub(super) async fn sequence_fixes(
    conn: &mut Conn,
    plan: &Plan,
    names: &Names,
    cache: u64,
) -> Result<Option<String>, Error> {
    let seq = names.sequence();
    let o = seq_options(conn, &seq).await?;
    if o.next > plan.max_packed() + 1 {
        return Err(other(
            "apply",
            format!(
                "sequence {seq} is at {}, past the layout's last value {}",
                o.next,
                plan.max_packed()
            ),
        ));
    }
    let want_cache = cache.max(1) as i64;
    let mut fix = Vec::new();
    if o.min != 0 && o.min > 0 {
        fix.push("MINVALUE 0".to_string());
    }
    if o.max != plan.max_packed() {
        fix.push(format!("MAXVALUE {}", plan.max_packed()));
    }
    if o.increment != 1 {
        fix.push("INCREMENT BY 1".into());
    }
    if o.cycle {
        fix.push("NOCYCLE".into());
    }
    if o.cache.max(1) != want_cache {
        fix.push(if want_cache == 1 {
            "NOCACHE".to_string()
        } else {
            format!("CACHE {want_cache}")
        });
    }
    Ok((!fix.is_empty()).then(|| format!("ALTER SEQUENCE `{seq}` {}", fix.join(" "))))
}

/// The connection of the clock event's running loop, if one runs.
async fn clock_holder(conn: &mut Conn, names: &Names) -> Result<Option<u64>, Error> {
    let holder: Option<Option<u64>> = conn
        .query_first(format!("SELECT IS_USED_LOCK({})", names.clock_lock_sql()))
        .await
        .map_err(my("looking for a running clock event"))?;
    Ok(holder.flatten())
}

/// Waits up to `within` for the clock event's loop to hold its lock.
pub(super) async fn wait_clock(
    conn: &mut Conn,
    names: &Names,
    within: Duration,
) -> Result<bool, Error> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if clock_running(conn, names).await? {
            return Ok(true);
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates or replaces a procedure whose body or `sql_mode` differs from
/// `create` (`CREATE OR REPLACE` on MariaDB: no moment without it; `DROP`
/// then `CREATE` on MySQL). Whether it did.
pub(super) async fn replace_procedure(
    conn: &mut Conn,
    name: &str,
    create: &str,
    mariadb: bool,
) -> Result<bool, Error> {
    if !routine_differs(conn, name, "PROCEDURE", create).await? {
        return Ok(false);
    }
    if mariadb {
        let create = create.replacen("CREATE PROCEDURE", "CREATE OR REPLACE PROCEDURE", 1);
        conn.query_drop(create)
            .await
            .map_err(my("creating the procedure"))?;
    } else {
        conn.query_drop(format!("DROP PROCEDURE IF EXISTS `{name}`"))
            .await
            .map_err(my("dropping the old procedure"))?;
        conn.query_drop(create)
            .await
            .map_err(my("creating the procedure"))?;
    }
    Ok(true)
}

pub(super) async fn install_locked(
    conn: &mut Conn,
    plan: &Plan,
    names: &Names,
    mariadb: bool,
) -> Result<bool, Error> {
    conn.query_drop(sql::sequences_sql(&names.locked_row()))
        .await
        .map_err(my(ROW_LOCK_COUNTER))?;
    replace_procedure(
        conn,
        &names.locked_procedure(),
        &sql::locked_procedure_sql(plan, names),
        mariadb,
    )
    .await
}

pub(super) async fn install_seed(
    conn: &mut Conn,
    names: &Names,
    mariadb: bool,
) -> Result<bool, Error> {
    conn.query_drop(sql::sequences_sql(&names.seed_row()))
        .await
        .map_err(my("creating sequences"))?;
    replace_procedure(
        conn,
        &names.seed_procedure(),
        &sql::seed_procedure_sql(&names.seed_procedure(), &names.seed_row()),
        mariadb,
    )
    .await
}

/// Raises the recorded high-water to the sequence's reservation less its
/// cache (never lowers it).
pub(super) async fn raise_floor(conn: &mut Conn, plan: &Plan, names: &Names) -> Result<(), Error> {
    let Some(hw) = plan.high_water(names) else {
        return Ok(());
    };
    let below: Option<i64> = conn
        .query_first(format!(
            "SELECT GREATEST(next_not_cached_value - cache_size, 0) FROM `{}`",
            names.sequence()
        ))
        .await
        .map_err(my("reading the sequence"))?;
    conn.query_drop(format!("DO SETVAL({hw}, {}, 0)", below.unwrap_or(0)))
        .await
        .map_err(my("raising the high-water"))
}

/// The table in the seed's shape if missing; an existing one's counter
/// parked and its id given a default.
async fn install_table(
    conn: &mut Conn,
    plan: &Plan,
    names: &Names,
    applied: &mut Applied,
) -> Result<(), Error> {
    match id_column(conn, &names.table).await? {
        None if table_exists(conn, &names.table).await? => {
            return Err(other(
                "apply",
                format!("table {} has no id column", names.table),
            ));
        }
        None => {
            conn.query_drop(sql::table_sql(plan, names))
                .await
                .map_err(my("creating the table"))?;
            applied.installed.push(format!("table {}", names.table));
        }
        Some(col) => {
            col.usable(&names.table)?;
            if col.auto_increment()
                && auto_increment_counter(conn, &names.table).await? < sql::AUTO_INCREMENT_PARKED
            {
                // Instant (metadata only): rows inserted while the trigger
                // is missing fail instead of taking ids ours repeat.
                conn.query_drop(format!(
                    "ALTER TABLE `{}` AUTO_INCREMENT = {}",
                    names.table,
                    sql::AUTO_INCREMENT_PARKED
                ))
                .await
                .map_err(my("parking the AUTO_INCREMENT counter"))?;
                applied.installed.push(format!(
                    "AUTO_INCREMENT of {} parked at {}",
                    names.table,
                    sql::AUTO_INCREMENT_PARKED
                ));
            }
            if !col.auto_increment() && col.default.is_none() {
                // INSERT ... SELECT without an id needs a default in strict mode.
                conn.query_drop(format!(
                    "ALTER TABLE `{}` ALTER COLUMN id SET DEFAULT 0",
                    names.table
                ))
                .await
                .map_err(my("giving the id column a default"))?;
                applied
                    .installed
                    .push(format!("default 0 of {}.id", names.table));
            }
        }
    }
    Ok(())
}

/// The guard column, the trigger, then the guard's default 0.
pub(super) async fn install_guard_and_trigger(
    conn: &mut Conn,
    plan: &Plan,
    names: &Names,
    applied: &mut Applied,
) -> Result<(), Error> {
    // The guard column the trigger sets, before the trigger that sets it.
    let (column, checked) = guard(conn, &names.table).await?;
    if column.is_some() && !checked {
        // Its CHECK dropped by hand: rows inserted since (without the
        // trigger) hold the default 0, which the CHECK added back would
        // refuse. They were made without the trigger whatever happens
        // (adopt counts them as old ids). A scan of the table, only on
        // this way back.
        conn.query_drop(sql::mark_guard_rows_sql(&names.table))
            .await
            .map_err(my("marking the rows inserted without the guard"))?;
    }
    if column.is_none() || !checked {
        conn.query_drop(sql::add_guard_sql(&names.table))
            .await
            .map_err(my("adding the guard column"))?;
        applied.installed.push(format!(
            "column {}.{} and its check",
            names.table,
            sql::GUARD_COLUMN
        ));
    }
    let trigger = sql::trigger_sql(plan, names);
    if trigger_differs(conn, names, &trigger).await? {
        conn.query_drop(&trigger)
            .await
            .map_err(my("creating the trigger"))?;
        applied
            .installed
            .push(format!("trigger {}", names.trigger()));
    }
    if guard(conn, &names.table).await?.0.as_deref() != Some("0") {
        // The trigger sets the column now: inserts without it fail.
        conn.query_drop(sql::guard_default_sql(&names.table))
            .await
            .map_err(my("setting the guard column's default"))?;
    }
    Ok(())
}

/// The clock event, replaced only when it differs.
async fn install_event(
    conn: &mut Conn,
    plan: &Plan,
    names: &Names,
    applied: &mut Applied,
) -> Result<(), Error> {
    // The clock event.
    let event = names.event();
    let current: Option<(Option<String>, Option<String>, String)> = conn
        .exec_first(
            "SELECT EVENT_DEFINITION, EVENT_COMMENT, STATUS FROM information_schema.EVENTS WHERE EVENT_SCHEMA = DATABASE() AND EVENT_NAME = ?",
            (&event,),
        )
        .await
        .map_err(my("looking up the clock event"))?;
    let wanted = sql::event_sql(plan, names);
    let same = current.as_ref().is_some_and(|(def, comment, status)| {
        status == "ENABLED"
            && def.as_deref().map(str::trim) == body_after(&wanted, "\nDO ")
            && comment.as_deref() == comment_of(&wanted)
    });
    if !same {
        // The loop of the old body, if one runs: taken before the CREATE,
        // since the scheduler may start the new body at once, and killing
        // that one would leave no loop for up to a second.
        let old_loop = clock_holder(conn, names).await?;
        conn.query_drop(&wanted)
            .await
            .map_err(my("creating the clock event"))?;
        if let Some(id) = old_loop {
            // End it; the scheduler starts the new body.
            let _ = conn.query_drop(format!("KILL CONNECTION {id}")).await;
        }
        applied.installed.push(format!("event {event}"));
    }
    Ok(())
}
