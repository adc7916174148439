//! `serve` with `tls_cert_file`, `tls_key_file` and `api_token_file`, in
//! this process (moved from the CLI crate's `serve_tls.rs`): HTTPS and
//! gRPC over TLS with certificates this test makes itself (a CA and a server
//! certificate for 127.0.0.1), the bearer token over both, and the errors a
//! client meets with the wrong CA, no TLS, or no or a wrong token.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rustls::pki_types::{CertificateDer, ServerName};
use shardflake_service::grpc::pb;
use shardflake_service::grpc::pb::id_service_client::IdServiceClient;
use shardflake_testkit::{Http, error_code, id_of, snowflake_node};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::node::Node;

const TOKEN: &str = "t0ken-for-tests";

/// A CA named `ca_name` and the PEM files of a server certificate it signed
/// for 127.0.0.1 and localhost, written under `dir`.
struct Pki {
    ca_pem: String,
    ca_der: CertificateDer<'static>,
}

fn make_pki(dir: &Path, ca_name: &str) -> anyhow::Result<Pki> {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, ca_name);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate()?)?;
    let server_key = rcgen::KeyPair::generate()?;
    let server = rcgen::CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])?
        .signed_by(&server_key, &ca)?;
    std::fs::write(dir.join("server.pem"), server.pem())?;
    std::fs::write(dir.join("server.key"), server_key.serialize_pem())?;
    Ok(Pki {
        ca_pem: ca.pem(),
        ca_der: ca.der().clone(),
    })
}

/// One HTTPS request (`Connection: close`) trusting only `ca`: status and body.
async fn https_get(
    addr: &str,
    ca: &CertificateDer<'static>,
    path: &str,
    auth: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone())?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1")?;
    let mut tls = connector.connect(name, tcp).await?;
    let auth = auth.map_or(String::new(), |a| format!("authorization: {a}\r\n"));
    let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\n{auth}connection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    tls.read_to_string(&mut response).await?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status line in {response:?}"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((status, body))
}

/// A gRPC client over TLS trusting `ca_pem`.
async fn grpc_tls(
    addr: &str,
    ca_pem: &str,
) -> anyhow::Result<IdServiceClient<tonic::transport::Channel>> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name("localhost");
    let channel = Endpoint::from_shared(format!("https://{addr}"))?
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await?;
    Ok(IdServiceClient::new(channel))
}

fn with_token<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_listeners_and_bearer_token() -> anyhow::Result<()> {
    let dir = shardflake_testkit::tempdir()?;
    let pki = make_pki(&dir, "shardflake test CA")?;
    let wrong_dir = dir.join("wrong");
    std::fs::create_dir_all(&wrong_dir)?;
    let wrong = make_pki(&wrong_dir, "another CA")?;
    std::fs::write(dir.join("token"), format!("{TOKEN}\n"))?;
    let file = |name: &str| dir.join(name).display().to_string();
    let s = Node::start(&format!(
        "node_id = 6\ntls_cert_file = {:?}\ntls_key_file = {:?}\napi_token_file = {:?}",
        file("server.pem"),
        file("server.key"),
        file("token")
    ))
    .await?;

    // Ready over HTTPS; probes and scrapers need no token.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match https_get(&s.http, &pki.ca_der, "/readyz", None).await {
            Ok((200, _)) => break,
            other if Instant::now() > deadline => {
                anyhow::bail!("not ready: {other:?}: {}", s.stderr())
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    for path in ["/healthz", "/metrics"] {
        let (st, body) = https_get(&s.http, &pki.ca_der, path, None).await?;
        assert_eq!(st, 200, "{path}: {body}");
    }

    // HTTP: no token and a wrong token are refused with the documented code.
    for auth in [None, Some("Bearer wrong"), Some(TOKEN)] {
        let (st, body) = https_get(&s.http, &pki.ca_der, "/v1/id", auth).await?;
        assert_eq!(
            (st, error_code(&body).as_str()),
            (401, "unauthorized"),
            "{auth:?}: {body}"
        );
    }
    let bearer = format!("Bearer {TOKEN}");
    let (st, body) = https_get(&s.http, &pki.ca_der, "/v1/id", Some(&bearer)).await?;
    assert_eq!(st, 200, "{body}");
    assert_eq!(snowflake_node(id_of(&body)?), 6);

    // A client trusting another CA stops at the handshake, saying why.
    let e = https_get(&s.http, &wrong.ca_der, "/v1/id", Some(&bearer))
        .await
        .unwrap_err();
    assert!(format!("{e:#}").contains("UnknownIssuer"), "{e:#}");
    // A plain-HTTP client is told to use HTTPS.
    let (st, body) = Http::new(&s.http).get("/healthz").await?;
    assert_eq!(
        (st, error_code(&body).as_str()),
        (400, "tls_required"),
        "{body}"
    );

    // gRPC over TLS: the same token rules.
    let mut g = grpc_tls(&s.grpc, &pki.ca_pem).await?;
    let id = g
        .next_id(with_token(pb::NextIdRequest {}, TOKEN))
        .await?
        .into_inner()
        .id;
    assert_eq!(snowflake_node(id), 6);
    for req in [
        tonic::Request::new(pb::NextIdRequest {}),
        with_token(pb::NextIdRequest {}, "wrong"),
    ] {
        let status = g.next_id(req).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
        assert_eq!(
            status
                .metadata()
                .get("x-error-code")
                .and_then(|v| v.to_str().ok()),
            Some("unauthorized")
        );
    }
    // Trusting another CA, the gRPC client cannot connect.
    let e = match grpc_tls(&s.grpc, &wrong.ca_pem).await {
        Ok(mut g) => g
            .next_id(with_token(pb::NextIdRequest {}, TOKEN))
            .await
            .map(|_| ())
            .map_err(anyhow::Error::from),
        Err(e) => Err(e),
    }
    .unwrap_err();
    let chain = format!("{e:?}");
    assert!(chain.contains("UnknownIssuer"), "{chain}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_and_token_files_fail_the_start() {
    let dir = shardflake_testkit::tempdir().unwrap();
    make_pki(&dir, "shardflake test CA").unwrap();
    let file = |name: &str| dir.join(name).display().to_string();
    let run = async |toml: String| match Node::start(&toml).await {
        Err(e) => format!("{e:#}"),
        Ok(mut s) => {
            let status = s.exit(Duration::from_secs(20)).await.unwrap();
            assert!(!status.success(), "{toml:?} should fail");
            s.stderr()
        }
    };
    let tls = |cert: &str, key: &str| {
        format!(
            "tls_cert_file = {:?}\ntls_key_file = {:?}",
            file(cert),
            file(key)
        )
    };
    let e = run(tls("server.pem", "server.pem")).await;
    assert!(e.contains("TLS key"), "{e}");
    let e = run(tls("none.pem", "server.key")).await;
    assert!(e.contains("reading TLS certificate"), "{e}");
    let e = run(format!("api_token_file = {:?}", file("no-such-token"))).await;
    assert!(e.contains("reading API token file"), "{e}");
    let e = run(format!("tls_cert_file = {:?}", file("server.pem"))).await;
    assert!(e.contains("--tls-key"), "{e}");
}
