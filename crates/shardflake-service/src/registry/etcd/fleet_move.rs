//! `shardflake fleet move`: a stopped fleet carried to another prefix or
//! another etcd cluster with its records, so that its nodes (and their
//! state files) start there as where they left off.
//!
//! Under the fleet's lock: the old place's layout record is retired for
//! the new place in a transaction that compares that nothing under the old
//! prefix was written since it was read (no node holds or waits for an id
//! there), so every node started at the old place is refused from then on.
//! Then the new place, compared empty, gets in one transaction the fleet
//! id, the layout record, every id's high-water (its record, or the clock
//! now plus `raise` where that is later: a holder's record bounds what it
//! stamped, and `raise` covers a holder whose record an etcd restore lost,
//! its clock ahead of ours), a floor every take there resumes past (the
//! clock now plus `raise`, or the old place's floor), and the fleet's
//! registration in that cluster. An id taken before whose record was
//! deleted by hand gets a record `--max-resume-wait` past the clock, the
//! wait a take at the old place makes for it. `raise` is added to the
//! clock, never on top of a record: a record already ahead (a node stopped
//! while it waited out a floor put back after a delete) plus `raise` could
//! be further ahead than the fleet's nodes wait, and every take there
//! would be refused. A floor further ahead than the fleet's window +
//! `--max-resume-wait` is refused before anything is written, for the same
//! reason.
//! A move stopped between the two steps is finished by running it again.
//! A fleet whose etcd was restored from a snapshot (or whose records are a
//! copy from another cluster, `<prefix>/cluster`) is moved only with a
//! raise of at least the fleet's `--max-resume-wait`: a record the restore
//! rolled back, which no take at the old place believes, would be believed
//! at the new one. A move to another cluster also marks the fleet's
//! registration in the old one as moved there (it outlives a delete of
//! the old prefix: a node started there is refused, told where the fleet
//! went). The new place holds the fleet's generation plus one:
//! a node that ran there is refused at any place holding an older one (the
//! old place brought back by a restore of a snapshot taken before).
//!
//! `shardflake fleet confirm` ([`confirm_place`]): after an etcd restore,
//! the operator's word that a place is still its fleet's, so that nodes
//! without a state file of it take ids there again.

use super::{
    CLUSTER, CONFIRMED, RETIRED, check_registered, client, copy_check, fleet_registry_key,
    moved_registration, parse_retired, read_generation, read_high_water, read_registrations,
    registrations_unchanged, stamp_text,
};
use crate::config::EtcdConfig;
use crate::etcd::{Compare, EtcdError, Op};
use crate::registry::AcquireError;

/// Why a fleet was not moved.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    /// etcd failed or refused.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    /// The old place holds no fleet.
    #[error(
        "etcd prefix {prefix} holds no fleet (no {prefix}/layout or {prefix}/fleet): nothing to move; check --etcd and --etcd-prefix"
    )]
    NoFleet {
        /// The old prefix.
        prefix: String,
    },
    /// A node of the fleet holds or waits for an id.
    #[error(
        "a node of the fleet under {prefix} runs: {key} (held by {holder:?}); stop every node of the fleet, then run the move again. After an etcd restore it may be a lease the restore brought back, its process gone: it ends with its TTL (`etcdctl lease timetolive`); run the move again after it"
    )]
    Running {
        /// The old prefix.
        prefix: String,
        /// The key found.
        key: String,
        /// Its value.
        holder: String,
    },
    /// The old place was retired for another place.
    #[error(
        "etcd prefix {prefix} was retired for {successor}: the fleet runs there now; move it from there"
    )]
    Retired {
        /// The old prefix.
        prefix: String,
        /// Where the fleet went.
        successor: String,
    },
    /// The new place is not empty.
    #[error(
        "--to-prefix {prefix} already holds {key}: a fleet moves only to an empty place; choose another --to-prefix"
    )]
    NotEmpty {
        /// The new prefix.
        prefix: String,
        /// A key found there.
        key: String,
    },
    /// The old and the new place are one.
    #[error("--to-etcd and --to-prefix name the place the fleet is in ({prefix}): nothing to move")]
    Same {
        /// The prefix.
        prefix: String,
    },
    /// A record of the old place does not read.
    #[error(
        "{key} holds {value:?}, which this command cannot read; fix it, then run the move again"
    )]
    Unreadable {
        /// The key.
        key: String,
        /// Its value.
        value: String,
    },
    /// A place changed while the move read it.
    #[error(
        "{prefix} changed while the move read it (a node started?); stop every node of the fleet, then run the move again"
    )]
    Changed {
        /// The prefix that changed.
        prefix: String,
    },
    /// The place's records are a copy of another cluster's, or hold a
    /// fleet id this cluster does not register: the same check as a take.
    #[error("{0}. This command refuses it as a take does{1}")]
    Copied(Box<AcquireError>, String),
    /// The old place saw an etcd restore and the raise is short of it.
    #[error(
        "etcd under {prefix} was restored from a snapshot ({prefix}/restored, or its revision past its raft index, or {prefix}/cluster naming another cluster: a copy): a high-water record there may be older than what its holder stamped, up to the fleet's --max-resume-wait past its clock. Run the move with --raise at least that (the fleet's --max-resume-wait, given to the move: {min_ms} ms)"
    )]
    RestoreSeen {
        /// The old prefix.
        prefix: String,
        /// The least raise: the fleet's --max-resume-wait.
        min_ms: u64,
    },
    /// The new place's floor would be further ahead of this clock than the
    /// fleet's nodes wait (window + --max-resume-wait): every take there
    /// would be refused.
    #[error(
        "the move would write {floor_ms} ({floor_at}) as {to_prefix}/floor, {what}: {ahead_ms} ms ahead of this host's clock, more than the fleet's window + --max-resume-wait ({limit_ms} ms), the furthest a node started there waits: each would be refused as too far ahead. Nothing was changed. {way_out}"
    )]
    FloorAhead {
        /// The new prefix.
        to_prefix: String,
        /// The floor the move would write (Unix ms).
        floor_ms: u64,
        /// The same, RFC 3339.
        floor_at: String,
        /// Where it comes from: `--raise` or the old place's floor record.
        what: String,
        /// How far ahead of this host's clock.
        ahead_ms: u64,
        /// The fleet's window + --max-resume-wait, as given to the move.
        limit_ms: u64,
        /// The command that gets out.
        way_out: String,
    },
    /// The destination cluster refuses the fleet (another fleet there
    /// could make its ids, or it is registered elsewhere there).
    #[error("{0}")]
    Refused(AcquireError),
}

/// What a move did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    /// The fleet id carried.
    pub fleet: String,
    /// The layout record carried.
    pub layout: String,
    /// How many ids' high-waters were carried.
    pub high_waters: usize,
    /// The floor written at the new place (Unix ms): every take there
    /// resumes past it.
    pub floor_ms: u64,
    /// The new place already held the fleet (a move run again): nothing
    /// written there.
    pub already: bool,
    /// The fleet's generation at the new place.
    pub generation: u64,
}

/// Moves the fleet under `from`'s prefix to `to`'s endpoints and prefix;
/// `now_ms` is this host's clock, `raise_ms` how far past it the carried
/// high-waters and the floor go at least (a record further ahead is
/// carried as it is); `max_resume_wait_ms` the fleet's
/// `--max-resume-wait`: the least raise where etcd was restored;
/// `window_ms` the fleet's `--window`: the floor may go as far ahead of
/// this clock as a take there waits, window + max_resume_wait.
pub async fn move_fleet(
    from: &EtcdConfig,
    to: &EtcdConfig,
    now_ms: u64,
    raise_ms: u64,
    max_resume_wait_ms: u64,
    window_ms: u64,
    copy_of_gone: Option<&str>,
) -> Result<Moved, MoveError> {
    let (old, new) = (&from.prefix, &to.prefix);
    let src = client(from)?;
    let dst = client(to)?;
    let (kvs, header) = src
        .range_prefix_header(format!("{old}/").as_bytes())
        .await?;
    let (dkvs, dheader) = dst
        .range_prefix_header(format!("{new}/").as_bytes())
        .await?;
    let same_cluster = header.cluster_id == dheader.cluster_id;
    if same_cluster && old == new {
        return Err(MoveError::Same {
            prefix: old.clone(),
        });
    }
    let find = |key: String| kvs.iter().find(|kv| kv.key == key.as_bytes());
    let no_fleet = || MoveError::NoFleet {
        prefix: old.clone(),
    };
    let layout_kv = find(format!("{old}/layout")).ok_or_else(no_fleet)?;
    let fleet = find(format!("{old}/fleet"))
        .ok_or_else(no_fleet)?
        .value
        .clone();
    let successor = if same_cluster {
        new.clone()
    } else {
        format!(
            "{new} on etcd cluster={:x} ({})",
            dheader.cluster_id,
            to.endpoints.join(",")
        )
    };
    let (record, retired) = match parse_retired(&layout_kv.value) {
        Some((s, was)) if s == successor => (was.into_bytes(), true),
        Some((s, _)) => {
            return Err(MoveError::Retired {
                prefix: old.clone(),
                successor: s,
            });
        }
        None => (layout_kv.value.clone(), false),
    };
    // A record a restore rolled back is believed by no take there (see
    // registry/etcd.rs); carried elsewhere, it would be: raised past what
    // its lost holder may have stamped instead.
    // So is a copy of another cluster's records, told by any record there
    // that names its cluster (see `copied_from`).
    // Refused, as at a take, unless the operator names the cluster the
    // records were copied from as gone (`copy_of_gone`): the fleet may run
    // there, and a move would carry its ids to a place beside it.
    let fleet_id = String::from_utf8_lossy(&fleet).into_owned();
    let (src_registered, src_registered_at) = read_registrations(&src, false).await?;
    let copied = match copy_check(
        old,
        &kvs,
        &src_registered,
        src_registered_at,
        header.cluster_id,
        &[fleet_id.as_str()],
        || None,
        None,
    ) {
        Ok(()) => false,
        Err(AcquireError::FleetCopied(c)) if copy_of_gone == Some(c.recorded.as_str()) => true,
        Err(e) => {
            return Err(MoveError::Copied(
                Box::new(e),
                ": nothing was moved".to_string(),
            ));
        }
    };
    let restored = copied
        || find(format!("{old}/restored")).is_some()
        || src.status().await.is_ok_and(|s| s.restored());
    if restored && raise_ms < max_resume_wait_ms {
        return Err(MoveError::RestoreSeen {
            prefix: old.clone(),
            min_ms: max_resume_wait_ms,
        });
    }
    let live = [format!("{old}/node/"), format!("{old}/queue/")];
    if let Some(kv) = kvs
        .iter()
        .find(|kv| live.iter().any(|p| kv.key.starts_with(p.as_bytes())))
    {
        return Err(MoveError::Running {
            prefix: old.clone(),
            key: String::from_utf8_lossy(&kv.key).into_owned(),
            holder: String::from_utf8_lossy(&kv.value).into_owned(),
        });
    }
    // Every id's high-water, raised; the floor past all of them.
    let hw_prefix = format!("{old}/hw/");
    let mut high_waters = Vec::new();
    let unreadable = |key: &[u8], value: &[u8]| MoveError::Unreadable {
        key: String::from_utf8_lossy(key).into_owned(),
        value: String::from_utf8_lossy(value).into_owned(),
    };
    // Past this clock by `raise`: what a holder whose record a restore
    // lost may have stamped (its clock up to that far ahead of ours).
    let raised_clock = now_ms.saturating_add(raise_ms);
    for kv in &kvs {
        let Some(id) = kv
            .key
            .strip_prefix(hw_prefix.as_bytes())
            .and_then(|id| std::str::from_utf8(id).ok())
            .and_then(|id| id.parse::<u64>().ok())
        else {
            continue;
        };
        let key = String::from_utf8_lossy(&kv.key).into_owned();
        let ms = read_high_water(id, &key, Some(&kv.value))
            .map_err(|_| unreadable(&kv.key, &kv.value))?;
        // A record bounds what its holder stamped: carried as it is where
        // it is past the raised clock (a record further ahead than the
        // nodes wait is skipped by their takes, as at the old place).
        high_waters.push((id, ms.max(raised_clock)));
    }
    // An id taken before (`taken/<id>`) whose record was deleted by hand:
    // its holder, stopped by its failing record, may have stamped as far
    // ahead as its clock ran. A take at the old place waits
    // `--max-resume-wait` past its clock for it; the new place holds no
    // stamp to tell, so the move writes that wait as the id's record.
    let stamp_prefix = format!("{old}/taken/");
    let lost_holder = now_ms.saturating_add(max_resume_wait_ms.max(raise_ms));
    for id in kvs.iter().filter_map(|kv| {
        std::str::from_utf8(kv.key.strip_prefix(stamp_prefix.as_bytes())?)
            .ok()?
            .parse::<u64>()
            .ok()
    }) {
        if !high_waters.iter().any(|&(carried, _)| carried == id) {
            tracing::warn!(
                node_id = id,
                "{old}/hw/{id} is missing, but node id {id} was taken before ({stamp_prefix}{id}): carried as --max-resume-wait past this clock"
            );
            high_waters.push((id, lost_holder));
        }
    }
    // The floor covers the ids without a record; an old floor (put back
    // after a delete) is carried as it is.
    let old_floor = match find(format!("{old}/floor")) {
        Some(kv) => {
            read_high_water(0, "", Some(&kv.value)).map_err(|_| unreadable(&kv.key, &kv.value))?
        }
        None => 0,
    };
    let floor_ms = raised_clock.max(old_floor);
    let ahead_ms = floor_ms.saturating_sub(now_ms);
    // The take's own limit (`Claim::max_ahead_ms`): a floor no further
    // ahead than it is waited out by every node there.
    let limit_ms = window_ms.saturating_add(max_resume_wait_ms);
    if ahead_ms > limit_ms {
        let (what, way_out) = if old_floor > raised_clock {
            let ready = old_floor.saturating_sub(limit_ms);
            (
                format!("the old place's {old}/floor"),
                format!(
                    "Run the move again after {} (this clock within window + --max-resume-wait of that floor), or give it the fleet's own --window and --max-resume-wait if they are longer",
                    shardflake::timestamp::rfc3339_ms(ready)
                ),
            )
        } else {
            (
                format!("this host's clock plus --raise {raise_ms} ms"),
                format!(
                    "Run the move again with --raise {limit_ms}ms or less (and --window and --max-resume-wait the fleet's own)"
                ),
            )
        };
        return Err(MoveError::FloorAhead {
            to_prefix: new.clone(),
            floor_ms,
            floor_at: shardflake::timestamp::rfc3339_ms(floor_ms),
            what,
            ahead_ms,
            limit_ms,
            way_out,
        });
    }
    // The new place: empty, or this fleet already moved there.
    let new_fleet_key = format!("{new}/fleet").into_bytes();
    let new_layout_key = format!("{new}/layout").into_bytes();
    if let Some(kv) = dkvs.first() {
        let holds =
            |key: &[u8], value: &[u8]| dkvs.iter().any(|kv| kv.key == key && kv.value == value);
        if !(holds(&new_fleet_key, &fleet) && holds(&new_layout_key, &record)) {
            return Err(MoveError::NotEmpty {
                prefix: new.clone(),
                key: String::from_utf8_lossy(&kv.key).into_owned(),
            });
        }
    }
    let already = !dkvs.is_empty();
    let (registered, registered_at) = read_registrations(&dst, false).await?;
    let registration = check_registered(
        &registered,
        new,
        &fleet,
        &record,
        same_cluster.then_some(old.as_str()),
        dheader.cluster_id,
    )
    .map_err(MoveError::Refused)?;
    // Moved to another cluster: the fleet's registration in the old one
    // says where it went, which a delete of the old prefix leaves (a
    // fresh node there is told, not advised to put records back).
    let mark_moved = (!same_cluster).then(|| {
        Op::Put(
            fleet_registry_key(&fleet),
            moved_registration(old, &record, header.cluster_id, &successor),
            0,
        )
    });
    // The fleet's lock: from here on, no node takes an id at the old place.
    if !retired {
        let value = format!("{RETIRED}{successor}: {}", String::from_utf8_lossy(&record));
        let mut ops = vec![Op::Put(layout_kv.key.clone(), value.into_bytes(), 0)];
        ops.extend(mark_moved);
        let answer = src
            .txn(
                &[
                    Compare::ValueIs(layout_kv.key.clone(), layout_kv.value.clone()),
                    Compare::NoneWrittenAfter(format!("{old}/").into_bytes(), header.revision),
                ],
                &ops,
                &[],
            )
            .await?;
        if !answer.succeeded {
            return Err(MoveError::Changed {
                prefix: old.clone(),
            });
        }
        tracing::warn!("retired {old} for {successor}: nodes started there are refused");
    } else if let Some(mark) = mark_moved {
        // A move run again after it retired the old place (or one of an
        // earlier version, which marked nothing).
        src.txn(&[], &[mark], &[]).await?;
    }
    let generation = read_generation(&kvs, old).saturating_add(1);
    let moved = Moved {
        generation,
        fleet: String::from_utf8_lossy(&fleet).into_owned(),
        layout: String::from_utf8_lossy(&record).into_owned(),
        high_waters: high_waters.len(),
        floor_ms,
        already,
    };
    if already {
        return Ok(moved);
    }
    let mut ops = vec![
        Op::Put(new_fleet_key.clone(), fleet.clone(), 0),
        Op::Put(new_layout_key.clone(), record.clone(), 0),
        Op::Put(
            format!("{new}/floor").into_bytes(),
            floor_ms.to_string().into_bytes(),
            0,
        ),
        Op::Put(
            format!("{new}/generation").into_bytes(),
            generation.to_string().into_bytes(),
            0,
        ),
        Op::Put(
            format!("{new}/{CLUSTER}").into_bytes(),
            format!("{:x}", dheader.cluster_id).into_bytes(),
            0,
        ),
    ];
    for (id, ms) in &high_waters {
        ops.push(Op::Put(
            format!("{new}/hw/{id}").into_bytes(),
            ms.to_string().into_bytes(),
            0,
        ));
    }
    for (key, value) in registration {
        ops.push(Op::Put(key, value, 0));
    }
    // The new place is the fleet's by this move: confirmed, should its
    // cluster show a restore (its nodes' state files name the old place).
    if let Ok(status) = dst.status().await {
        ops.push(Op::Put(
            format!("{new}/{CONFIRMED}").into_bytes(),
            stamp_text(&status, dheader.cluster_id).into_bytes(),
            0,
        ));
    }
    let answer = dst
        .txn(
            &[
                [
                    Compare::NoneWrittenAfter(format!("{new}/").into_bytes(), dheader.revision),
                    Compare::Absent(new_fleet_key),
                    Compare::Absent(new_layout_key),
                ]
                .as_slice(),
                &registrations_unchanged(registered_at),
            ]
            .concat(),
            &ops,
            &[],
        )
        .await?;
    if !answer.succeeded {
        return Err(MoveError::Changed {
            prefix: new.clone(),
        });
    }
    Ok(moved)
}

/// What `shardflake fleet confirm` confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmed {
    /// The fleet id the place holds (`None`: no fleet yet).
    pub fleet: Option<String>,
    /// Its generation there.
    pub generation: u64,
    /// Whether etcd shows a restore (its revision past its raft index, or
    /// `<prefix>/restored`).
    pub restore_seen: bool,
    /// Whether `<prefix>/confirmed` was written (not where the place holds
    /// no record and etcd shows no restore: nothing to confirm).
    pub written: bool,
}

/// Records the operator's word that the place of `cfg` is still its
/// fleet's after an etcd restore: `<prefix>/confirmed` holds etcd's status
/// now, and takes believe it while etcd's history descends from it (a
/// later restore needs a confirmation of its own). Refused at a retired
/// place. Uses [`MoveError`] for its failures (the same places, the same
/// etcd).
pub async fn confirm_place(cfg: &EtcdConfig) -> Result<Confirmed, MoveError> {
    let prefix = &cfg.prefix;
    let etcd = client(cfg)?;
    let (kvs, header) = etcd
        .range_prefix_header(format!("{prefix}/").as_bytes())
        .await?;
    let find = |name: &str| {
        let key = format!("{prefix}/{name}");
        kvs.iter().find(|kv| kv.key == key.as_bytes())
    };
    if let Some((successor, _)) = find("layout").and_then(|kv| parse_retired(&kv.value)) {
        return Err(MoveError::Retired {
            prefix: prefix.clone(),
            successor,
        });
    }
    // A copy is never confirmed: the fleet may run where it was copied
    // from (its way out is `fleet move --copy-of-gone-cluster`).
    let (registered, registered_at) = read_registrations(&etcd, false).await?;
    let fleet = find("fleet").map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
    if let Err(e) = copy_check(
        prefix,
        &kvs,
        &registered,
        registered_at,
        header.cluster_id,
        &fleet.as_deref().into_iter().collect::<Vec<_>>(),
        || None,
        None,
    ) {
        return Err(MoveError::Copied(
            Box::new(e),
            ": nothing was confirmed".to_string(),
        ));
    }
    let status = etcd.status().await?;
    // The restore itself is recorded by takes (registry/etcd.rs): a record
    // written here, after a take's own, would make that take's stamp look
    // older than the restore.
    let ops = [Op::Put(
        format!("{prefix}/{CONFIRMED}").into_bytes(),
        stamp_text(&status, header.cluster_id).into_bytes(),
        0,
    )];
    let restore_seen = find("restored").is_some() || status.restored();
    // No record and no restore: nothing a node would be refused for here
    // (and a record written would be all the place holds).
    if kvs.is_empty() && !restore_seen {
        return Ok(Confirmed {
            fleet,
            generation: 0,
            restore_seen,
            written: false,
        });
    }
    etcd.txn(&[], &ops, &[]).await?;
    tracing::warn!(
        "{prefix}/{CONFIRMED} recorded: nodes without a state file of this place take ids here again"
    );
    Ok(Confirmed {
        fleet,
        generation: read_generation(&kvs, prefix),
        restore_seen,
        written: true,
    })
}
