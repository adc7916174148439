//! The topology file: layout, logical shards, physical servers and the
//! sharded tables, parsed from TOML and validated once.
//!
//! ```toml
//! layout = "instagram"        # preset name or layout spec; default instagram
//! shards = 8                  # logical shards, at most 2^(shard bits)
//! schema_prefix = "shard"     # schema of shard 5 is "shard5" (default "shard")
//! sign_bit = "refuse"         # or "allow" (see crate docs); default refuse
//! generation = 0              # written by `pg move-shard`; default 0
//!
//! [[servers]]
//! name = "pg1"               # a-z, 0-9, _ and -, starting with a letter
//! url = "postgres://postgres@127.0.0.1:5432/postgres"
//! shards = "0-3"              # ranges and single shards: "0-3,7"
//!
//! [[servers]]
//! name = "pg2"
//! url = "postgres://postgres@127.0.0.1:5433/postgres"
//! shards = "4-7"
//!
//! [[tables]]
//! name = "posts"
//! sql = """CREATE TABLE {schema}.posts (
//!   id bigint PRIMARY KEY DEFAULT {next_id},
//!   user_id bigint NOT NULL,
//!   body text)"""
//! ```
//!
//! In a table's `sql`, `{schema}` becomes the shard's schema and `{next_id}`
//! the call of that shard's id function on the shard's one id sequence.
//!
//! `generation` counts the moves the file has seen: each `pg move-shard`
//! records generation N + 1 on every server, then writes it into the file
//! it switched. A file older than the generation its servers record is
//! refused (see [`crate::pg::catalog`]): it may put a shard where it no
//! longer lives, or leave out the server that now holds it.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::Path;

use serde::Deserialize;
use shardflake::{FieldKind, Layout, preset};

use crate::SHARD_FIELD;

/// What the generated functions do once the time would set the sign bit of a
/// signed `bigint` (layouts that use all 64 bits, such as Instagram's, from
/// 2046-06-27).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SignBit {
    /// Raise an error instead of handing out a negative id (default): ids stay
    /// positive and ordered, and the deadline is loud.
    #[default]
    Refuse,
    /// Hand out ids with the top bit set: negative as `bigint`, still unique,
    /// but they sort before every earlier id.
    Allow,
}

/// Errors in a topology file. Each names what is wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// The file could not be read.
    #[error("reading topology {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error that stopped it.
        source: std::io::Error,
    },
    /// Not valid TOML, or fields of the wrong type.
    #[error("topology is not valid TOML: {0}")]
    Toml(String),
    /// The layout could not be resolved.
    #[error("layout {spec:?}: {source}")]
    Layout {
        /// The `layout` value.
        spec: String,
        /// What is wrong with the layout.
        source: shardflake::LayoutError,
    },
    /// The layout has no `shard` field, or other node fields.
    #[error(
        "layout {layout:?} must have exactly one node field, named \"shard\" (it has: {fields})"
    )]
    NoShardField {
        /// Layout name.
        layout: String,
        /// Its node fields.
        fields: String,
    },
    /// Zero shards, or more than the shard field holds.
    #[error(
        "shards = {shards}: layout {layout:?} has {bits} shard bits, so 1..={max} logical shards"
    )]
    ShardCount {
        /// Asked for.
        shards: u64,
        /// Layout.
        layout: String,
        /// Shard field width.
        bits: u32,
        /// Largest allowed.
        max: u64,
    },
    /// No `[[servers]]`.
    #[error("no [[servers]] in topology")]
    NoServers,
    /// Two servers with one name.
    #[error("server name {0:?} is used twice")]
    DuplicateServer(String),
    /// A server name outside the allowed characters (names reach generated
    /// SQL, e.g. the fenced copy's "moved to server X" message).
    #[error(
        "server name {0:?} must be 1-63 characters of a-z, 0-9, _ and -, starting with a letter"
    )]
    BadServerName(String),
    /// A URL that does not parse or is not postgres://.
    #[error("server {server:?}: bad url {url:?}: {reason}")]
    BadUrl {
        /// Server.
        server: String,
        /// The url.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A shard list that does not parse.
    #[error("server {server:?}: bad shard list {spec:?}: {reason}")]
    BadShardList {
        /// Server.
        server: String,
        /// The list.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A shard beyond `shards`.
    #[error("server {server:?} holds shard {shard}, but shards = {shards} (valid: 0..={last})")]
    ShardOutOfRange {
        /// Server.
        server: String,
        /// Shard.
        shard: u64,
        /// Count.
        shards: u64,
        /// Last valid shard.
        last: u64,
    },
    /// A shard held by two servers.
    #[error("shard {shard} is held by both {first:?} and {second:?} (overlapping ranges)")]
    Overlap {
        /// Shard.
        shard: u64,
        /// One server.
        first: String,
        /// The other.
        second: String,
    },
    /// Shards held by nobody.
    #[error("shards {0} are not held by any server (missing ranges)")]
    Missing(String),
    /// A bad schema prefix.
    #[error(
        "schema_prefix {0:?} must be a lower-case SQL identifier (a-z, 0-9, _; not starting with a digit)"
    )]
    BadPrefix(String),
    /// A bad table entry.
    #[error("table {table:?}: {reason}")]
    BadTable {
        /// Table.
        table: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No such server (for moves and lookups).
    #[error("no server named {0:?} in topology")]
    UnknownServer(String),
    /// No such shard.
    #[error("shard {shard} does not exist (shards = {shards})")]
    UnknownShard {
        /// Shard.
        shard: u64,
        /// Count.
        shards: u64,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTopology {
    #[serde(default = "default_layout")]
    layout: String,
    shards: u64,
    #[serde(default = "default_prefix")]
    schema_prefix: String,
    #[serde(default)]
    sign_bit: SignBit,
    #[serde(default)]
    generation: u64,
    #[serde(default)]
    servers: Vec<RawServer>,
    #[serde(default)]
    tables: Vec<Table>,
}

fn default_layout() -> String {
    "instagram".into()
}
fn default_prefix() -> String {
    "shard".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    name: String,
    url: String,
    shards: String,
}

/// A sharded table: created in every shard's schema from a SQL template.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table {
    /// Table name (a lower-case SQL identifier); its ids come from the
    /// shard's one sequence, `id_seq` in the shard's schema.
    pub name: String,
    /// `CREATE TABLE {schema}.<name> (... DEFAULT {next_id} ...)`.
    pub sql: String,
}

/// One physical PostgreSQL server and the logical shards it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// Its name in the topology.
    pub name: String,
    /// Connection URL (`postgres://user@host:port/db`).
    pub url: String,
    /// Logical shards, ascending.
    pub shards: Vec<u64>,
}

/// A validated topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    layout_spec: String,
    layout: Layout,
    shards: u64,
    schema_prefix: String,
    sign_bit: SignBit,
    generation: u64,
    servers: Vec<Server>,
    tables: Vec<Table>,
    owner: Vec<usize>,
}

impl Topology {
    /// Reads and validates a topology file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, TopologyError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| TopologyError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parses and validates topology TOML.
    pub fn parse(text: &str) -> Result<Self, TopologyError> {
        let raw: RawTopology =
            toml::from_str(text).map_err(|e| TopologyError::Toml(e.to_string()))?;
        let layout = preset::resolve(&raw.layout).map_err(|source| TopologyError::Layout {
            spec: raw.layout.clone(),
            source,
        })?;
        let nodes: Vec<_> = layout.node_fields().collect();
        if nodes.len() != 1 || nodes[0].name() != SHARD_FIELD {
            return Err(TopologyError::NoShardField {
                layout: layout.name().to_string(),
                fields: nodes
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let bits = nodes[0].bits();
        let max = 1u64 << bits;
        if raw.shards == 0 || raw.shards > max {
            return Err(TopologyError::ShardCount {
                shards: raw.shards,
                layout: layout.name().to_string(),
                bits,
                max,
            });
        }
        if !is_ident(&raw.schema_prefix) {
            return Err(TopologyError::BadPrefix(raw.schema_prefix));
        }
        if raw.servers.is_empty() {
            return Err(TopologyError::NoServers);
        }
        let mut owner: Vec<Option<usize>> = vec![None; raw.shards as usize];
        let mut servers = Vec::new();
        for (i, s) in raw.servers.into_iter().enumerate() {
            if !is_server_name(&s.name) {
                return Err(TopologyError::BadServerName(s.name));
            }
            if servers.iter().any(|o: &Server| o.name == s.name) {
                return Err(TopologyError::DuplicateServer(s.name));
            }
            check_url(&s.name, &s.url)?;
            let shards =
                parse_shard_list(&s.shards).map_err(|reason| TopologyError::BadShardList {
                    server: s.name.clone(),
                    spec: s.shards.clone(),
                    reason,
                })?;
            for &shard in &shards {
                if shard >= raw.shards {
                    return Err(TopologyError::ShardOutOfRange {
                        server: s.name,
                        shard,
                        shards: raw.shards,
                        last: raw.shards - 1,
                    });
                }
                if let Some(prev) = owner[shard as usize] {
                    let first: &Server = &servers[prev];
                    return Err(TopologyError::Overlap {
                        shard,
                        first: first.name.clone(),
                        second: s.name,
                    });
                }
                owner[shard as usize] = Some(i);
            }
            servers.push(Server {
                name: s.name,
                url: s.url,
                shards,
            });
        }
        let missing: Vec<u64> = owner
            .iter()
            .enumerate()
            .filter(|(_, o)| o.is_none())
            .map(|(i, _)| i as u64)
            .collect();
        if !missing.is_empty() {
            return Err(TopologyError::Missing(format_shard_list(&missing)));
        }
        let mut seen = BTreeMap::new();
        for t in &raw.tables {
            let bad = |reason: &str| TopologyError::BadTable {
                table: t.name.clone(),
                reason: reason.to_string(),
            };
            if !is_ident(&t.name) {
                return Err(bad(
                    "name must be a lower-case SQL identifier (a-z, 0-9, _)",
                ));
            }
            if seen.insert(t.name.clone(), ()).is_some() {
                return Err(bad("defined twice"));
            }
            if !t.sql.contains("{schema}") {
                return Err(bad("sql must contain the {schema} placeholder"));
            }
        }
        Ok(Topology {
            layout_spec: raw.layout,
            layout,
            shards: raw.shards,
            schema_prefix: raw.schema_prefix,
            sign_bit: raw.sign_bit,
            generation: raw.generation,
            servers,
            tables: raw.tables,
            owner: owner.into_iter().map(|o| o.unwrap_or(0)).collect(),
        })
    }

    /// The id layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// The `layout` value as written.
    pub fn layout_spec(&self) -> &str {
        &self.layout_spec
    }
    /// Number of logical shards.
    pub fn shards(&self) -> u64 {
        self.shards
    }
    /// Sign-bit policy.
    pub fn sign_bit(&self) -> SignBit {
        self.sign_bit
    }
    /// How many moves this file has seen (`generation`, 0 if absent).
    pub fn generation(&self) -> u64 {
        self.generation
    }
    /// The same topology at another generation.
    pub fn with_generation(&self, generation: u64) -> Topology {
        Topology {
            generation,
            ..self.clone()
        }
    }
    /// Schema prefix.
    pub fn schema_prefix(&self) -> &str {
        &self.schema_prefix
    }
    /// The physical servers.
    pub fn servers(&self) -> &[Server] {
        &self.servers
    }
    /// The sharded tables.
    pub fn tables(&self) -> &[Table] {
        &self.tables
    }
    /// The schema of a logical shard (`shard5`).
    pub fn schema(&self, shard: u64) -> String {
        format!("{}{}", self.schema_prefix, shard)
    }
    /// The server holding a logical shard.
    pub fn server_of(&self, shard: u64) -> Result<&Server, TopologyError> {
        if shard >= self.shards {
            return Err(TopologyError::UnknownShard {
                shard,
                shards: self.shards,
            });
        }
        Ok(&self.servers[self.owner[shard as usize]])
    }
    /// A server by name.
    pub fn server(&self, name: &str) -> Result<&Server, TopologyError> {
        self.servers
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| TopologyError::UnknownServer(name.to_string()))
    }

    /// The same topology with `shard` held by server `to`.
    pub fn with_shard_moved(&self, shard: u64, to: &str) -> Result<Topology, TopologyError> {
        self.server_of(shard)?;
        let to_index = self
            .servers
            .iter()
            .position(|s| s.name == to)
            .ok_or_else(|| TopologyError::UnknownServer(to.to_string()))?;
        let mut t = self.clone();
        for s in &mut t.servers {
            s.shards.retain(|&x| x != shard);
        }
        t.servers[to_index].shards.push(shard);
        t.servers[to_index].shards.sort_unstable();
        t.owner[shard as usize] = to_index;
        Ok(t)
    }

    /// The topology as TOML, in the form [`Topology::parse`] reads.
    pub fn to_toml(&self) -> String {
        let mut out = String::new();
        let q = |s: &str| toml::Value::String(s.to_string()).to_string();
        let _ = writeln!(out, "layout = {}", q(&self.layout_spec));
        let _ = writeln!(out, "shards = {}", self.shards);
        let _ = writeln!(out, "schema_prefix = {}", q(&self.schema_prefix));
        let sign = match self.sign_bit {
            SignBit::Refuse => "refuse",
            SignBit::Allow => "allow",
        };
        let _ = writeln!(out, "sign_bit = {}", q(sign));
        if self.generation > 0 {
            let _ = writeln!(out, "generation = {}", self.generation);
        }
        for s in &self.servers {
            let _ = writeln!(out, "\n[[servers]]");
            let _ = writeln!(out, "name = {}", q(&s.name));
            let _ = writeln!(out, "url = {}", q(&s.url));
            let _ = writeln!(out, "shards = {}", q(&format_shard_list(&s.shards)));
        }
        for t in &self.tables {
            let _ = writeln!(out, "\n[[tables]]");
            let _ = writeln!(out, "name = {}", q(&t.name));
            let _ = writeln!(out, "sql = {}", q(&t.sql));
        }
        out
    }

    /// Writes the topology to `path` atomically (temp file, fsync, rename).
    pub fn save(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        write_atomically(path.as_ref(), &self.to_toml())
    }

    /// Writes this topology's servers' shard lists and its generation into
    /// the file at `path`, keeping the rest of it as the user wrote it (comments, order,
    /// layout), atomically. Where the file cannot be edited so (it no
    /// longer parses, or edited it would not read back as this topology),
    /// writes [`Topology::to_toml`] instead, with a warning.
    pub fn save_keeping_comments(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)?;
        match self.edited(&text) {
            Some(edited) => write_atomically(path, &edited),
            None => {
                tracing::warn!(
                    path = %path.display(),
                    "could not edit the topology file in place; rewriting it (its comments are lost)"
                );
                self.save(path)
            }
        }
    }

    /// `text` with each `[[servers]]` entry's `shards` set to this
    /// topology's list and `generation` to its generation (the values'
    /// comments kept), if it then reads back as this topology.
    fn edited(&self, text: &str) -> Option<String> {
        let mut doc: toml_edit::DocumentMut = text.parse().ok()?;
        let generation = toml_edit::Value::from(self.generation as i64);
        match doc.get_mut("generation").and_then(|i| i.as_value_mut()) {
            Some(value) => {
                let decor = value.decor().clone();
                *value = generation;
                *value.decor_mut() = decor;
            }
            None if self.generation > 0 => {
                doc.insert("generation", toml_edit::Item::Value(generation));
            }
            None => {}
        }
        let servers = doc.get_mut("servers")?.as_array_of_tables_mut()?;
        for table in servers.iter_mut() {
            let name = table.get("name")?.as_str()?.to_string();
            let server = self.servers.iter().find(|s| s.name == name)?;
            let list = format_shard_list(&server.shards);
            match table.get_mut("shards").and_then(|i| i.as_value_mut()) {
                Some(value) => {
                    let decor = value.decor().clone();
                    *value = toml_edit::Value::from(list);
                    *value.decor_mut() = decor;
                }
                None => {
                    table.insert("shards", toml_edit::value(list));
                }
            }
        }
        let edited = doc.to_string();
        (Topology::parse(&edited).ok()? == *self).then_some(edited)
    }
}

/// Writes `text` to `path` atomically (temp file, fsync, rename).
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} logical shards of {} on {} servers",
            self.shards,
            self.layout,
            self.servers.len()
        )
    }
}

/// Whether `s` is a plain lower-case SQL identifier.
pub fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 40
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !s.as_bytes()[0].is_ascii_digit()
}

/// Whether `s` is a valid server name: 1-63 characters of `a-z`, `0-9`, `_`
/// and `-`, starting with a letter. Like schema names, so a name never needs
/// quoting or escaping where it reaches SQL (string literals inside
/// dollar-quoted function bodies) or logs.
pub fn is_server_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.as_bytes()[0].is_ascii_lowercase()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

fn check_url(server: &str, raw: &str) -> Result<(), TopologyError> {
    let bad = |reason: String| TopologyError::BadUrl {
        server: server.to_string(),
        url: raw.to_string(),
        reason,
    };
    let u = url::Url::parse(raw).map_err(|e| bad(e.to_string()))?;
    if u.scheme() != "postgres" && u.scheme() != "postgresql" {
        return Err(bad(format!(
            "scheme must be postgres:// (got {}://)",
            u.scheme()
        )));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host".into()));
    }
    raw.parse::<tokio_postgres::Config>()
        .map_err(|e| bad(e.to_string()))?;
    Ok(())
}

/// Parses `"0-3,7,9-10"` into ascending shards.
pub fn parse_shard_list(spec: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    if spec.trim().is_empty() {
        return Ok(out);
    }
    for part in spec.split(',') {
        let part = part.trim();
        let num = |s: &str| {
            s.trim()
                .parse::<u64>()
                .map_err(|_| format!("{s:?} is not a shard number"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("range {part:?} runs backwards"));
                }
                if b - a > 1 << 20 {
                    return Err(format!("range {part:?} is too long"));
                }
                out.extend(a..=b);
            }
            None => out.push(num(part)?),
        }
    }
    out.sort_unstable();
    if let Some(w) = out.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("shard {} is listed twice", w[0]));
    }
    Ok(out)
}

/// Formats ascending shards as ranges: `[0,1,2,3,7]` → `"0-3,7"`.
pub fn format_shard_list(shards: &[u64]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < shards.len() {
        let start = shards[i];
        let mut end = start;
        while i + 1 < shards.len() && shards[i + 1] == end + 1 {
            i += 1;
            end = shards[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            let _ = write!(out, "{start}");
        } else {
            let _ = write!(out, "{start}-{end}");
        }
        i += 1;
    }
    out
}

/// The kind check used by [`Topology::parse`], exposed for the SQL generator.
pub(crate) fn shard_field(layout: &Layout) -> &shardflake::Field {
    layout
        .node_fields()
        .find(|f| f.kind() == FieldKind::Node && f.name() == SHARD_FIELD)
        .expect("validated topology layouts have a shard field")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_keeps_the_files_comments_and_layout() {
        let text = "# our deployment\nlayout = \"instagram\"  # Instagram's\nshards = 4\n\n\
            [[servers]]\nname = \"a\"\nurl = \"postgres://a/db\"\nshards = \"0-3\" # all of them, for now\n\n\
            # the new one\n[[servers]]\nname = \"b\"\nurl = \"postgres://b/db\"\nshards = \"\"\n";
        let t = Topology::parse(text).unwrap();
        let moved = t.with_shard_moved(2, "b").unwrap();
        let edited = moved.edited(text).unwrap();
        assert_eq!(
            edited,
            text.replace("\"0-3\" #", "\"0-1,3\" #")
                .replace("shards = \"\"\n", "shards = \"2\"\n")
        );
        assert_eq!(Topology::parse(&edited).unwrap(), moved);
        // a move's generation goes in before the first table, then is replaced
        let next = moved.with_generation(1);
        let edited = next.edited(text).unwrap();
        assert!(edited.contains("shards = 4\ngeneration = 1\n"), "{edited}");
        assert_eq!(Topology::parse(&edited).unwrap(), next);
        let again = next.with_generation(2).edited(&edited).unwrap();
        assert_eq!(again, edited.replace("generation = 1", "generation = 2"));
        // a file that no longer matches the topology is not edited
        assert!(
            moved
                .edited("layout = \"instagram\"\nshards = 4\n")
                .is_none()
        );
    }

    const OK: &str = r#"
layout = "instagram"
shards = 8
[[servers]]
name = "a"
url = "postgres://postgres@127.0.0.1:5432/postgres"
shards = "0-3"
[[servers]]
name = "b"
url = "postgres://postgres@127.0.0.1:5433/postgres"
shards = "4-6,7"
[[tables]]
name = "posts"
sql = "CREATE TABLE {schema}.posts (id bigint PRIMARY KEY DEFAULT {next_id})"
"#;

    #[test]
    fn parses_and_routes() {
        let t = Topology::parse(OK).unwrap();
        assert_eq!(t.shards(), 8);
        assert_eq!(t.server_of(5).unwrap().name, "b");
        assert_eq!(t.schema(5), "shard5");
        assert_eq!(t.servers()[1].shards, vec![4, 5, 6, 7]);
        let again = Topology::parse(&t.to_toml()).unwrap();
        assert_eq!(again, t);
        let moved = t.with_shard_moved(2, "b").unwrap();
        assert_eq!(moved.server_of(2).unwrap().name, "b");
        assert_eq!(format_shard_list(&moved.servers()[0].shards), "0-1,3");
        assert_eq!(Topology::parse(&moved.to_toml()).unwrap(), moved);
    }

    fn err(text: &str) -> String {
        Topology::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn clear_errors() {
        assert!(err(&OK.replace("\"4-6,7\"", "\"3-7\"")).contains("shard 3 is held by both"));
        assert!(err(&OK.replace("\"4-6,7\"", "\"4-6\"")).contains("shards 7 are not held"));
        assert!(
            err(&OK.replace("shards = 8", "shards = 9000")).contains("13 shard bits, so 1..=8192")
        );
        assert!(err(&OK.replace("\"4-6,7\"", "\"4-8\"")).contains("holds shard 8"));
        assert!(
            err(&OK.replace("postgres://postgres@127.0.0.1:5433", "mysql://x")).contains("bad url")
        );
        assert!(
            err(&OK.replace("postgres://postgres@127.0.0.1:5433/postgres", "not a url"))
                .contains("bad url")
        );
        assert!(err(&OK.replace("\"0-3\"", "\"3-0\"")).contains("runs backwards"));
        assert!(err(&OK.replace("instagram", "snowflake")).contains("named \"shard\""));
        assert!(err(&OK.replace("{schema}.posts", "posts")).contains("{schema}"));
        assert!(err("shards = ").contains("not valid TOML"));
        assert!(err("shards = 1\n").contains("no [[servers]]"));
    }

    #[test]
    fn server_names_are_validated_like_schema_names() {
        let named = |name: &str| {
            OK.replace(
                "name = \"b\"",
                &format!("name = {}", toml::Value::String(name.into())),
            )
        };
        for bad in [
            "b$f$; DROP SCHEMA public CASCADE; --",
            "b$$",
            "$f$",
            "",
            "b'",
            "b\"",
            "b;",
            "b c",
            "B",
            "1b",
            "-b",
            "_b",
            "b.c",
            "b\\",
            "b\n",
            "bé",
            &"b".repeat(64),
        ] {
            let e = match Topology::parse(&named(bad)) {
                Ok(_) => panic!("server name {bad:?} accepted"),
                Err(e) => e,
            };
            assert!(
                matches!(&e, TopologyError::BadServerName(n) if n == bad),
                "{bad:?} accepted or wrong error: {e}"
            );
            assert!(e.to_string().contains("a-z, 0-9, _ and -"), "{e}");
        }
        for good in ["b", "pg2", "pg_eu-1", "hole", &"b".repeat(63)] {
            let t = Topology::parse(&named(good)).unwrap();
            assert_eq!(t.server_of(5).unwrap().name, good);
            assert_eq!(Topology::parse(&t.to_toml()).unwrap(), t);
        }
    }

    #[test]
    fn shard_lists() {
        assert_eq!(parse_shard_list("0-2, 5").unwrap(), vec![0, 1, 2, 5]);
        assert!(parse_shard_list("1,1").is_err());
        assert_eq!(format_shard_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
    }
}
