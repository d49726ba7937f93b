//! A tiny identity provider for the tests: an HTTP server (or https, with
//! the test CA's certificate) on 127.0.0.1:0
//! that serves a JSON Web Key Set the test swaps mid-run (a rotation), or
//! fails the way a provider can (a status, garbage, a stall). It counts
//! the requests, so a test awaits amble's next fetch instead of sleeping.
//! Keys are the committed test keys (tests/keys): RSA for RS256, Ed25519
//! for EdDSA.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use amble::auth::unix_now;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the provider answers.
#[derive(Clone, Debug)]
pub enum Serve {
    /// 200 with this key set.
    Keys(String),
    /// This status, with a short body.
    Status(u16),
    /// 200 with a body that is not JSON.
    Garbage,
    /// 200 with a key set padded past amble's 256 KiB.
    Huge,
    /// Reads the request and never answers.
    Stall,
}

/// The provider, until dropped.
pub struct JwksServer {
    pub addr: SocketAddr,
    scheme: &'static str,
    serve: Arc<Mutex<Serve>>,
    requests: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

impl JwksServer {
    /// Over plain http.
    pub async fn start(serve: Serve) -> Self {
        Self::start_with(serve, None).await
    }

    /// Over https, with a certificate for 127.0.0.1 signed by the test CA
    /// (tests/keys/jwks-ca.pem).
    pub async fn start_tls(serve: Serve) -> Self {
        use tokio_rustls::rustls::pki_types::pem::PemObject as _;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        use tokio_rustls::rustls::{ServerConfig, crypto::ring};
        let certs = vec![
            CertificateDer::from_pem_slice(&key_file("jwks-server.pem")).expect("certificate"),
        ];
        let key = PrivateKeyDer::from_pem_slice(&key_file("jwks-server-key.pem")).expect("key");
        let config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
        Self::start_with(
            serve,
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
        )
        .await
    }

    async fn start_with(serve: Serve, tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let serve = Arc::new(Mutex::new(serve));
        let (count, requests) = watch::channel(0);
        let count = Arc::new(count);
        let shared = Arc::clone(&serve);
        let tls_on = tls.is_some();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let serve = Arc::clone(&shared);
                let count = Arc::clone(&count);
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        None => answer(tcp, serve, count).await,
                        Some(tls) => {
                            if let Ok(stream) = tls.accept(tcp).await {
                                answer(stream, serve, count).await;
                            }
                        }
                    }
                });
            }
        });
        Self {
            addr,
            scheme: if tls_on { "https" } else { "http" },
            serve,
            requests,
            task,
        }
    }

    /// The key set's URL.
    pub fn url(&self) -> String {
        format!("{}://{}/.well-known/jwks.json", self.scheme, self.addr)
    }

    /// From now on, answers this way.
    pub fn serve(&self, serve: Serve) {
        *self.serve.lock().unwrap_or_else(PoisonError::into_inner) = serve;
    }

    /// Requests read so far.
    pub fn requests(&self) -> u64 {
        *self.requests.borrow()
    }

    /// Waits (at most `limit`) until `n` requests have been read.
    pub async fn until_requests(&self, n: u64, limit: Duration) {
        let mut requests = self.requests.clone();
        testkit::within(
            limit,
            &format!("request {n} for the key set"),
            requests.wait_for(|seen| *seen >= n),
        )
        .await
        .expect("the provider runs");
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    mut tcp: S,
    serve: Arc<Mutex<Serve>>,
    count: Arc<watch::Sender<u64>>,
) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match tcp.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 16 * 1024 {
            return;
        }
    }
    // Read and counted under one lock: every request counted after a
    // `serve` gets the new answer.
    let now = {
        let serve = serve.lock().unwrap_or_else(PoisonError::into_inner);
        count.send_modify(|n| *n += 1);
        serve.clone()
    };
    let (status, body) = match now {
        Serve::Keys(body) => ("200 OK".to_owned(), body),
        Serve::Status(code) => (format!("{code} Failing"), "{\"error\":\"down\"}".into()),
        Serve::Garbage => ("200 OK".to_owned(), "<html>not a key set</html>".into()),
        Serve::Huge => (
            "200 OK".to_owned(),
            format!("{{\"keys\": []{}}}", " ".repeat(300 * 1024)),
        ),
        Serve::Stall => {
            // Hold the connection until the client gives up.
            while matches!(tcp.read(&mut buf).await, Ok(n) if n > 0) {}
            return;
        }
    };
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tcp.write_all(response.as_bytes()).await;
    let _ = tcp.shutdown().await;
}

fn key_file(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/keys")
            .join(name),
    )
    .expect("test key")
}

/// The test RSA key (RS256) as a public JWK under `kid`.
pub fn rsa_jwk(kid: &str) -> serde_json::Value {
    let key = EncodingKey::from_rsa_pem(&key_file("rsa-private.pem")).expect("rsa");
    let mut jwk = jsonwebtoken::jwk::Jwk::from_encoding_key(&key, Algorithm::RS256).expect("jwk");
    jwk.common.key_id = Some(kid.into());
    serde_json::to_value(jwk).expect("json")
}

/// The test Ed25519 key (EdDSA) as a public JWK under `kid`: the public
/// key's last 32 bytes of DER are its `x`.
pub fn ed25519_jwk(kid: &str) -> serde_json::Value {
    use base64::Engine as _;
    let pem = String::from_utf8(key_file("ed25519-public.pem")).expect("text");
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .expect("base64");
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&der[der.len() - 32..]);
    serde_json::json!({ "kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "use": "sig" })
}

/// A key set of these keys.
pub fn key_set(keys: &[serde_json::Value]) -> String {
    serde_json::json!({ "keys": keys }).to_string()
}

/// A token for `sub` signed with the test RSA key (RS256) under `kid`.
pub fn rs256_token(kid: &str, sub: &str) -> String {
    let key = EncodingKey::from_rsa_pem(&key_file("rsa-private.pem")).expect("rsa");
    sign(kid, sub, Algorithm::RS256, &key)
}

/// A token for `sub` signed with the test Ed25519 key (EdDSA) under `kid`.
pub fn eddsa_token(kid: &str, sub: &str) -> String {
    let key = EncodingKey::from_ed_pem(&key_file("ed25519-private.pem")).expect("ed25519");
    sign(kid, sub, Algorithm::EdDSA, &key)
}

fn sign(kid: &str, sub: &str, alg: Algorithm, key: &EncodingKey) -> String {
    let mut header = Header::new(alg);
    header.kid = Some(kid.into());
    let claims = serde_json::json!({ "sub": sub, "exp": unix_now() + 600, "name": sub });
    jsonwebtoken::encode(&header, &claims, key).expect("sign")
}
