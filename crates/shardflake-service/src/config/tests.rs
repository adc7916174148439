//! The configuration's unit tests.

use super::*;
use shardflake_host::HostInfo;
use std::collections::BTreeMap;
use std::time::Duration;

fn no_host() -> HostInfo {
    HostInfo {
        hostname: String::new(),
        macs: Vec::new(),
        ip: None,
    }
}

/// `over` layered on the TOML text, validated.
fn load(over: RawConfig, toml: &str) -> Result<Config, ConfigError> {
    Config::validate(RawConfig::from_toml(toml)?.merge(over), &no_host())
}

fn err(over: RawConfig, toml: &str) -> String {
    load(over, toml).unwrap_err().to_string()
}

#[test]
fn embedded_default() {
    let c = Config::from_toml("").unwrap();
    assert_eq!(c.http.to_string(), "127.0.0.1:8080");
    assert_eq!(c.layout.name(), "snowflake");
    assert_eq!(c.node, NodeSource::Static(0));
    assert_eq!(c.node_field, "node");
    assert_eq!(c.shard_field, None);
    assert_eq!(c.rollback, RollbackPolicy::Error);
    assert_eq!((c.tls, c.api_token_file), (None, None));
}

#[test]
fn flags_override_the_file() {
    let args = RawConfig {
        node_id: Some(9),
        max_batch: Some(10),
        ..Default::default()
    };
    let c = load(args, "node_id = 3\nmax_batch = 5\nwindow = \"2s\"").unwrap();
    assert_eq!(c.node, NodeSource::Static(9));
    assert_eq!(c.max_batch, 10);
    assert_eq!(c.window, Duration::from_secs(2));
}

#[test]
fn merge_is_field_by_field_file_then_env_then_flags() {
    let file = RawConfig::from_toml(
        "layout = \"twitter\"\nmax_batch = 5\nwindow = \"2s\"\n\
         fields = { datacenter = 1, region = 7 }\n\
         [etcd]\nendpoints = [\"http://file:2379\"]\nprefix = \"/file\"\nlease_ttl = \"4s\"",
    )
    .unwrap();
    let env = RawConfig {
        max_batch: Some(6),
        workers: Some(2),
        fields: Some(BTreeMap::from([("datacenter".into(), 2)])),
        etcd: RawEtcd {
            prefix: Some("/env".into()),
            timeout: Some(Duration::from_millis(300)),
            ..Default::default()
        },
        ..Default::default()
    };
    let flags = RawConfig {
        workers: Some(3),
        etcd: RawEtcd {
            endpoints: Some(vec!["http://flag:2379".into()]),
            ..Default::default()
        },
        ..Default::default()
    };
    let raw = file.merge(env).merge(flags);
    // Each option from the last source that gives it.
    assert_eq!(raw.layout.as_deref(), Some("twitter"));
    assert_eq!(raw.window, Some(Duration::from_secs(2)));
    assert_eq!(raw.max_batch, Some(6));
    assert_eq!(raw.workers, Some(3));
    // Fixed fields merge name by name.
    let fields = BTreeMap::from([("datacenter".into(), 2), ("region".into(), 7)]);
    assert_eq!(raw.fields, Some(fields));
    // So does the [etcd] table.
    assert_eq!(
        raw.etcd,
        RawEtcd {
            endpoints: Some(vec!["http://flag:2379".into()]),
            prefix: Some("/env".into()),
            lease_ttl: Some(Duration::from_secs(4)),
            safety_margin: None,
            timeout: Some(Duration::from_millis(300)),
            ..RawEtcd::default()
        }
    );
    // An empty layer changes nothing, whichever side it is on.
    assert_eq!(raw.clone().merge(RawConfig::default()), raw);
    assert_eq!(RawConfig::default().merge(raw.clone()), raw);
}

#[test]
fn etcd_section() {
    let c = load(
        RawConfig::default(),
        "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nlease_ttl = \"4s\"\nprefix = \"/x/\"",
    )
    .unwrap();
    let NodeSource::Etcd(e) = c.node else {
        panic!()
    };
    assert_eq!(e.prefix, "/x");
    assert_eq!(e.lease_ttl, Duration::from_secs(4));
    assert_eq!(e.safety_margin, Duration::from_millis(800));
    // Another namespace than /x: refused, not read as /x.
    let slashless = load(
        RawConfig::default(),
        "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nprefix = \"x\"",
    );
    assert_eq!(
        slashless.unwrap_err(),
        ConfigError::EtcdPrefixSlash("x".into())
    );
    // A fleet id as a fleet's first node mints it, or refused.
    let fleet = |id: &str| {
        load(
            RawConfig::default(),
            &format!("[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nfleet = \"{id}\""),
        )
    };
    let Ok(Config {
        node: NodeSource::Etcd(e),
        ..
    }) = fleet("0123456789ABCDEF0123456789abcdef")
    else {
        panic!("a fleet id refused")
    };
    assert_eq!(e.fleet.as_deref(), Some("0123456789abcdef0123456789abcdef"));
    // A mistyped one is told what is wrong with it, and where to copy it.
    let said = |id: &str| fleet(id).unwrap_err().to_string();
    let prod = said("prod");
    assert!(
        prod.starts_with(
            "--fleet \"prod\" is not a fleet id: character 1 ('p') is not a hex digit"
        ) && prod.contains("etcdctl get <prefix>/fleet --print-value-only")
            && prod.contains("starts without --fleet"),
        "{prod}"
    );
    assert!(said("0123456789abcdef0123456789abcde").contains("it has 31 hex digits, not 32"),);
    assert!(said("/shardflake/prod").contains("looks like an etcd prefix, which is --etcd-prefix"));
    assert!(said("").contains("it is empty"));
    assert!(said("0123456789abcdef 0123456789abcdef").contains("character 17 (' ')"));
    // Without endpoints it would be ignored: refused.
    assert!(err(RawConfig::default(), "[etcd]\nfleet = \"prod\"").contains("fleet id"));
}

#[test]
fn etcd_tls_and_login_go_together() {
    let etcd = |extra: &str| {
        let toml = format!("[etcd]\nendpoints = [\"https://127.0.0.1:2379\"]\n{extra}");
        load(RawConfig::default(), &toml)
    };
    let Ok(c) = etcd("ca_file = \"ca.pem\"\nuser = \"u\"\npassword_file = \"pw\"") else {
        panic!("a CA and a login are enough")
    };
    let NodeSource::Etcd(e) = c.node else {
        panic!()
    };
    assert_eq!(e.tls.map(|t| t.ca_file), Some(PathBuf::from("ca.pem")));
    let login = e.login.expect("a login");
    assert_eq!(login.password, Secret::File("pw".into()));
    // The password never shows in logs.
    assert!(!format!("{login:?}").contains("hunter2"));
    for (extra, message) in [
        ("", "need the CA"),
        ("ca_file = \"c\"\ncert_file = \"x\"", "come together"),
        ("cert_file = \"x\"\nkey_file = \"y\"", "need --etcd-ca"),
        ("ca_file = \"c\"\nuser = \"u\"", "needs a password"),
        ("ca_file = \"c\"\npassword = \"p\"", "needs its user"),
        (
            "ca_file = \"c\"\nuser = \"u\"\npassword = \"p\"\npassword_file = \"f\"",
            "not both",
        ),
    ] {
        let e = etcd(extra).expect_err(extra);
        assert!(matches!(e, ConfigError::EtcdSecurity(_)), "{e:?}");
        assert!(e.to_string().contains(message), "{extra}: {e}");
    }
    let plain = "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nca_file = \"c\"";
    let e = load(RawConfig::default(), plain).expect_err("a CA without https");
    assert!(e.to_string().contains("apply to https://"), "{e}");
    let inline = EtcdLogin {
        user: "u".into(),
        password: Secret::Inline("hunter2".into()),
    };
    assert!(!format!("{inline:?}").contains("hunter2"));
}

fn etcd(endpoint: &str) -> RawEtcd {
    RawEtcd {
        endpoints: Some(vec![endpoint.into()]),
        ..Default::default()
    }
}

#[test]
fn clear_errors() {
    let none = RawConfig::default;
    assert!(err(none(), "node_id = 1024").contains("does not fit"));
    assert!(err(none(), "layout = \"twitter\"").contains("--field"));
    assert!(err(none(), "nope = 1").contains("unknown field"));
    assert!(err(none(), "[etcd]\nnope = 1").contains("unknown field"));
    assert!(err(none(), "window = \"soon\"").contains("not a duration like"));
    assert!(err(none(), "max_batch = 0").contains("max_batch"));
    assert!(err(none(), "rollback = \"sometimes\"").contains("rollback"));
    // A node id with etcd: that id, reserved in the registry.
    let pinned = RawConfig {
        etcd: etcd("http://127.0.0.1:1"),
        node_id: Some(1),
        ..Default::default()
    };
    let NodeSource::Etcd(e) = load(pinned, "").unwrap().node else {
        panic!("not etcd")
    };
    assert_eq!(e.pinned_node_id, Some(1));
    // etcd options without endpoints would mean static node 0.
    let c = load(none(), "").unwrap();
    assert_eq!((c.node, c.node_origin), (NodeSource::Static(0), "default"));
    for toml in ["[etcd]\nprefix = \"/p\"", "[etcd]\nlease_ttl = \"5s\""] {
        assert!(
            err(none(), toml).contains("without etcd endpoints"),
            "{toml}"
        );
    }
    let https = RawConfig {
        etcd: etcd("https://127.0.0.1:1"),
        ..Default::default()
    };
    assert!(err(https, "").contains("--etcd-ca"));
    let ftp = RawConfig {
        etcd: etcd("ftp://127.0.0.1:1"),
        ..Default::default()
    };
    assert!(err(ftp, "").contains("http://host:port or https://host:port"));
    let ttl = RawConfig {
        etcd: RawEtcd {
            lease_ttl: Some(Duration::from_millis(1500)),
            ..etcd("http://127.0.0.1:1")
        },
        ..Default::default()
    };
    assert!(err(ttl, "").contains("TTL"));
    assert!(err(none(), "borrow = \"3s\"").contains("below the window"));
    assert!(err(none(), "rollback = \"continue:5s\"").contains("below the window"));
    // Each below the window, but the generator adds them.
    let both = "borrow = \"2s\"\nrollback = \"continue:2s\"";
    assert!(err(none(), both).contains("plus rollback continue"));
    assert!(load(none(), "borrow = \"1s\"\nrollback = \"continue:1s\"").is_ok());
    // A request may not be held for half a minute.
    assert!(err(none(), "rollback = \"wait:30s\"").contains("at most 5s"));
    assert!(err(none(), "rollback = \"wait:x\"").contains("wait:DURATION, e.g."));
    assert!(load(none(), "rollback = \"wait:5s\"").is_ok());
    let slow = RawConfig {
        etcd: RawEtcd {
            timeout: Some(Duration::from_secs(1)),
            ..etcd("http://127.0.0.1:1")
        },
        window: Some(Duration::from_secs(2)),
        ..Default::default()
    };
    assert!(err(slow, "").contains("3 times the etcd timeout"));
    assert!(err(none(), "workers = 0").contains("workers"));
    assert!(err(none(), "max_body = 10").contains("max_body"));
}

#[test]
fn errors_are_typed() {
    let e = load(RawConfig::default(), "node_id = 1024").unwrap_err();
    assert!(
        matches!(e, ConfigError::NodeIdTooLarge { id: 1024, .. }),
        "{e:?}"
    );
    let e = load(RawConfig::default(), "layout = \"nope\"").unwrap_err();
    assert!(matches!(e, ConfigError::Layout { .. }), "{e:?}");
    let e = load(RawConfig::default(), "max_batch = 0").unwrap_err();
    assert_eq!(e, ConfigError::MaxBatch(0));
}

#[test]
fn tls_files_go_together() {
    let c = load(
        RawConfig::default(),
        "tls_cert_file = \"c.pem\"\ntls_key_file = \"k.pem\"\napi_token_file = \"t\"",
    )
    .unwrap();
    let files = TlsFiles {
        cert: "c.pem".into(),
        key: "k.pem".into(),
    };
    assert_eq!(c.tls, Some(files));
    assert_eq!(c.api_token_file, Some(PathBuf::from("t")));
    let half = err(RawConfig::default(), "tls_cert_file = \"c.pem\"");
    assert!(half.contains("tls_key_file is not"), "{half}");
    assert!(half.contains("--tls-key"), "{half}");
    let half = err(RawConfig::default(), "tls_key_file = \"k.pem\"");
    assert!(half.contains("tls_cert_file is not"), "{half}");
}

#[test]
fn host_step_is_separate_and_only_when_asked() {
    // Without node_id_from nothing is read from the host.
    let facts = RawConfig::default().host_facts();
    assert!(facts.hostname.is_empty() && facts.macs.is_empty() && facts.ip.is_none());
    // Validation reads the facts it is given, not the host.
    let pod = HostInfo {
        hostname: "ids-7".into(),
        macs: Vec::new(),
        ip: None,
    };
    let raw = RawConfig::from_toml("node_id_from = \"hostname\"").unwrap();
    let c = Config::validate(raw.clone(), &pod).unwrap();
    assert_eq!(c.node, NodeSource::Static(7));
    // An explicit node id wins over the host.
    let explicit = RawConfig {
        node_id: Some(2),
        ..raw.clone()
    };
    assert_eq!(
        Config::validate(explicit, &pod).unwrap().node,
        NodeSource::Static(2)
    );
    let e = Config::validate(raw, &no_host()).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("node id from hostname: host name \"\""),
        "{e}"
    );
    let mac = RawConfig::from_toml("node_id_from = \"mac\"").unwrap();
    let e = Config::validate(mac, &pod).unwrap_err();
    assert!(matches!(e, ConfigError::HostNodeId { .. }), "{e}");
    let bad = RawConfig::from_toml("node_id_from = \"dns\"").unwrap();
    assert!(
        Config::validate(bad, &pod)
            .unwrap_err()
            .to_string()
            .contains("use hostname, mac or ip")
    );
}

/// The files are read when the client is built (not by `validate`):
/// what is missing or is not what it says fails there, by name.
#[test]
fn etcd_tls_and_password_files_are_read_when_the_client_is_built() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (ca, key_file, pw) = (
        dir.path().join("ca.pem"),
        dir.path().join("key.pem"),
        dir.path().join("pw"),
    );
    std::fs::write(&ca, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    std::fs::write(&pw, "s3cret\n").unwrap();
    let config = |extra: String| {
        let toml = format!("[etcd]\nendpoints = [\"https://127.0.0.1:2379\"]\n{extra}");
        load(RawConfig::default(), &toml).unwrap()
    };
    let built = |c: Config| crate::registry::for_node_source(&c.node).map(|_| ());
    let missing = config(format!("ca_file = {:?}", dir.path().join("nope.pem")));
    assert!(built(missing).unwrap_err().to_string().contains("nope.pem"));
    // A key is not a certificate: the file must parse as what it is.
    let not_a_cert = config(format!("ca_file = {key_file:?}"));
    let e = built(not_a_cert).unwrap_err();
    assert!(
        e.needs_operator() && e.to_string().contains("no PEM certificate"),
        "{e}"
    );
    let no_pw = config(format!(
        "ca_file = {ca:?}\nuser = \"app\"\npassword_file = {:?}",
        dir.path().join("nopw")
    ));
    assert!(
        built(no_pw)
            .unwrap_err()
            .to_string()
            .contains("password file")
    );
    let full = config(format!(
        "ca_file = {ca:?}\ncert_file = {ca:?}\nkey_file = {key_file:?}\nuser = \"app\"\npassword_file = {pw:?}"
    ));
    let NodeSource::Etcd(e) = &full.node else {
        panic!()
    };
    // The password file's newline is dropped; Debug never shows it.
    let auth = e.login.as_ref().unwrap().read().unwrap();
    assert_eq!(
        (auth.user.as_str(), auth.password.as_str()),
        ("app", "s3cret")
    );
    assert!(!format!("{auth:?}").contains("s3cret"));
    built(full).unwrap();
}

#[test]
fn shard_layouts() {
    let spec = "orders: time 41 | node 6 | shard 6 | sequence 10 (epoch 1735689600000 ms)";
    let c = load(
        RawConfig {
            layout: Some(spec.into()),
            shards: Some(40),
            ..Default::default()
        },
        "",
    )
    .unwrap();
    assert_eq!(c.shard_field.as_deref(), Some("shard"));
    assert_eq!(c.shards, 40);
    // The key sets the shard: a fixed value would be shown and ignored.
    let fixed_shard = load(
        RawConfig {
            layout: Some(spec.into()),
            fields: Some(BTreeMap::from([("shard".into(), 5)])),
            ..Default::default()
        },
        "",
    )
    .unwrap_err();
    assert!(fixed_shard.to_string().contains("per request from the key"));
    let twitter = load(
        RawConfig {
            layout: Some("twitter".into()),
            node_field: Some("worker".into()),
            fields: Some(BTreeMap::from([("datacenter".into(), 3)])),
            ..Default::default()
        },
        "",
    )
    .unwrap();
    assert_eq!(twitter.fixed_fields, vec![("datacenter".into(), 3)]);
}
