//! `serve` against an etcd that demands TLS, client certificates and a
//! password, in this process (moved from the CLI crate's
//! `serve_etcd_tls.rs`): the certificates are made here (rcgen), the etcd started
//! by scripts/etcd.sh with `--client-cert-auth` and https client URLs.
//! Working settings get a node id; each wrong one fails the start with a
//! message naming the cause, and the client's error type says which.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use shardflake_service::etcd::{Client, ClientCert, EtcdAuth, EtcdError, EtcdTls};
use shardflake_testkit::{Etcd, EtcdTlsFiles, Http, id_of, tempdir};

use crate::node::Node;

/// A CA and the certificates it signed, as PEM files in `dir`.
struct Pki {
    dir: PathBuf,
    ca_file: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new(dir: &Path, name: &str) -> anyhow::Result<Pki> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        let ca_file = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&ca_file, cert.pem())?;
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca_file,
            issuer: Issuer::new(params, key),
        })
    }

    /// A certificate for 127.0.0.1/localhost, usable by a server and a client
    /// (etcd also dials itself with its own certificate).
    fn cert(&self, name: &str) -> anyhow::Result<ClientCert> {
        let mut params = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let files = ClientCert {
            cert_file: self.dir.join(format!("{name}.pem")),
            key_file: self.dir.join(format!("{name}-key.pem")),
        };
        std::fs::write(&files.cert_file, cert.pem())?;
        std::fs::write(&files.key_file, key.serialize_pem())?;
        Ok(files)
    }
}

/// A one-member etcd with https, `--client-cert-auth` and, with a root
/// password, authentication; and the client certificate it accepts.
struct Secured {
    etcd: Etcd,
    pki: Pki,
    client: ClientCert,
}

fn secured(root_password: Option<&str>) -> anyhow::Result<Secured> {
    let dir = tempdir()?;
    let pki = Pki::new(&dir, "etcd")?;
    let server = pki.cert("member")?;
    let client = pki.cert("client")?;
    let mut etcd = Etcd::start_with(
        1,
        Some(&EtcdTlsFiles {
            ca_file: pki.ca_file.clone(),
            server,
            client_cert: Some(client.clone()),
        }),
    )?;
    if let Some(pw) = root_password {
        etcd.enable_auth(pw)?;
    }
    Ok(Secured { etcd, pki, client })
}

/// Config file lines for a node on `s` under `prefix` (lease TTL 3 s);
/// `etcd_lines`: more of its `[etcd]` table.
fn serve_toml(s: &Secured, prefix: &str, etcd_lines: &str) -> String {
    format!(
        "[etcd]\nendpoints = {:?}\nprefix = {prefix:?}\nlease_ttl = \"3s\"\n{etcd_lines}",
        s.etcd.endpoints
    )
}

/// `[etcd]` lines for a CA, client certificate and key.
fn tls_lines(ca: &Path, client: &ClientCert) -> String {
    format!(
        "ca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n",
        path(ca),
        path(&client.cert_file),
        path(&client.key_file)
    )
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

/// Starts serve and expects it to fail at start; returns its error.
async fn refused_start(toml: String) -> anyhow::Result<String> {
    let out = match Node::start(&toml).await {
        // Refused before serving: the error says why.
        Err(e) => format!("{e:#}"),
        Ok(mut s) => {
            let status = s.exit(Duration::from_secs(20)).await?;
            anyhow::ensure!(!status.success(), "serve exited 0: {}", s.stderr());
            s.stderr()
        }
    };
    eprintln!("refused start: {}", out.trim());
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_over_mutual_tls_gets_a_node_id_and_issues_ids() -> anyhow::Result<()> {
    let s = secured(None)?;
    let toml = serve_toml(&s, "/t/mtls", &tls_lines(&s.pki.ca_file, &s.client));
    let a = Node::start(&toml).await?;
    let node = a.ready(Duration::from_secs(15)).await?;
    let mut c = Http::new(&a.http);
    let (st, body) = c.get("/v1/id").await?;
    assert_eq!(st, 200, "{body}");
    id_of(&body)?;
    // The node id is held in the TLS etcd, under the node's lease.
    let held = s.etcd.client().range_prefix(b"/t/mtls/node/").await?;
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].key, format!("/t/mtls/node/{node}").into_bytes());
    assert_ne!(held[0].lease, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_ca_missing_client_cert_or_wrong_password_fail_the_start_clearly()
-> anyhow::Result<()> {
    let s = secured(Some("root-secret"))?;
    let other = Pki::new(&s.pki.dir, "other")?;
    let right_pw = s.pki.dir.join("password");
    std::fs::write(&right_pw, "root-secret\n")?;
    let wrong_pw = s.pki.dir.join("wrong-password");
    std::fs::write(&wrong_pw, "guess\n")?;
    let timeout = Duration::from_secs(1);
    let mtls = |ca: &Path| EtcdTls {
        ca_file: ca.to_path_buf(),
        client_cert: Some(s.client.clone()),
    };
    let root = |pw: &str| EtcdAuth {
        user: "root".into(),
        password: pw.into(),
    };

    // A CA that did not sign etcd's certificate.
    let tls = mtls(&other.ca_file);
    let err = Client::connect(
        &s.etcd.endpoints,
        timeout,
        Some(&tls),
        Some(&root("root-secret")),
    )?
    .grant(3)
    .await
    .unwrap_err();
    assert!(matches!(&err, EtcdError::Tls { .. }), "{err}");
    assert!(err.needs_operator());
    let out = refused_start(serve_toml(
        &s,
        "/t/sec",
        &tls_lines(&other.ca_file, &s.client),
    ))
    .await?;
    assert!(
        out.contains("TLS with etcd failed") && out.contains("not signed by the CA in --etcd-ca"),
        "{out}"
    );

    // No client certificate.
    let tls = EtcdTls {
        ca_file: s.pki.ca_file.clone(),
        client_cert: None,
    };
    let err = Client::connect(&s.etcd.endpoints, timeout, Some(&tls), None)?
        .grant(3)
        .await
        .unwrap_err();
    assert!(matches!(&err, EtcdError::Tls { .. }), "{err}");
    let out = refused_start(serve_toml(
        &s,
        "/t/sec",
        &format!("ca_file = {:?}", path(&s.pki.ca_file)),
    ))
    .await?;
    assert!(
        out.contains("TLS with etcd failed") && out.contains("requires a client certificate"),
        "{out}"
    );

    // A wrong password.
    let tls = mtls(&s.pki.ca_file);
    let err = Client::connect(&s.etcd.endpoints, timeout, Some(&tls), Some(&root("guess")))?
        .grant(3)
        .await
        .unwrap_err();
    assert!(matches!(&err, EtcdError::Auth(_)), "{err}");
    let tls = tls_lines(&s.pki.ca_file, &s.client);
    let login = |pw: &Path| format!("{tls}user = \"root\"\npassword_file = {:?}\n", path(pw));
    let out = refused_start(serve_toml(&s, "/t/sec", &login(&wrong_pw))).await?;
    assert!(
        out.contains("etcd authentication failed") && out.contains("invalid user ID or password"),
        "{out}"
    );

    // No credentials, though etcd requires them.
    let out = refused_start(serve_toml(&s, "/t/sec", &tls)).await?;
    assert!(out.contains("--etcd-user"), "{out}");

    // All right: a node id, ids.
    let a = Node::start(&serve_toml(&s, "/t/sec", &login(&right_pw))).await?;
    a.ready(Duration::from_secs(15)).await?;
    let (st, body) = Http::new(&a.http).get("/v1/id").await?;
    assert_eq!(st, 200, "{body}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_token_is_renewed() -> anyhow::Result<()> {
    // Turning authentication off forgets every token etcd handed out; once
    // it is back on, the client's token is "invalid", and the client must
    // log in again instead of failing.
    let s = secured(Some("root-secret"))?;
    let client = s.etcd.client();
    client.range_prefix(b"/t/").await?;
    s.etcd.etcdctl(&["auth", "disable"])?;
    s.etcd.etcdctl(&["auth", "enable"])?;
    client.range_prefix(b"/t/").await?;
    let (lease, _) = client.grant(5).await?;
    assert!(client.keep_alive(lease).await? > 0);
    client.revoke(lease).await?;
    Ok(())
}
