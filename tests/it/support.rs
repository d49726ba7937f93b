//! A test server on an ephemeral port and a small protocol client.

use std::time::Duration;

use amble::config::Config;
use amble::protocol::pb::{self, client_message::Body as C, server_message::Body as S};
use amble::protocol::{Motion, MotionRecord, Position, decode_motion, encode_client, move_body};
use futures_util::{SinkExt as _, StreamExt as _};
use prost::Message as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long any single wait in a test may take.
pub const WAIT: Duration = Duration::from_secs(10);

pub async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// Sends `raw` as the whole request to `addr` and returns the whole
/// response, read until the server closes the connection.
pub async fn request_at(addr: std::net::SocketAddr, raw: &str) -> String {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(raw.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    within("http response", tcp.read_to_end(&mut out))
        .await
        .expect("read");
    String::from_utf8_lossy(&out).into_owned()
}

pub struct TestServer {
    pub addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), amble::StartError>>>,
}

/// A config for tests: the defaults, with whatever `f` changes.
pub fn config(f: impl FnOnce(&mut Config)) -> Config {
    let mut c = Config::default();
    f(&mut c);
    c
}

impl TestServer {
    pub async fn start() -> Self {
        Self::with(Config::default()).await
    }

    pub async fn with(config: Config) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(amble::serve(listener, config, async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// A client whose socket asks for a tiny (4 KiB) receive window, so that
    /// a test can fill it by not reading.
    pub async fn narrow_client(&self) -> Client {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4_096).expect("SO_RCVBUF");
        let tcp = within("connect", socket.connect(self.addr))
            .await
            .expect("connect");
        let (ws, _) = within(
            "handshake",
            tokio_tungstenite::client_async(
                format!("ws://{}/ws", self.addr),
                MaybeTlsStream::Plain(tcp),
            ),
        )
        .await
        .expect("handshake");
        Client::from_stream(ws)
    }

    pub async fn client(&self) -> Client {
        Client::connect(&format!("ws://{}/ws", self.addr)).await
    }

    /// A client that has joined `room` as `name`.
    pub async fn joined(&self, room: &str, name: &str) -> (Client, pb::Welcome) {
        let mut c = self.client().await;
        let w = c.join(room, name).await;
        (c, w)
    }

    /// `GET path`, returning the status line and body.
    pub async fn get(&self, path: &str) -> (String, String) {
        let mut tcp = TcpStream::connect(self.addr).await.expect("connect");
        let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        tcp.write_all(req.as_bytes()).await.expect("write");
        let mut raw = Vec::new();
        within("http response", tcp.read_to_end(&mut raw))
            .await
            .expect("read");
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").expect("http response");
        (
            head.lines().next().unwrap_or_default().to_owned(),
            body.to_owned(),
        )
    }

    /// Sends `raw` as the whole request and returns the whole response (the
    /// request should ask for `Connection: close`).
    pub async fn request(&self, raw: &str) -> String {
        request_at(self.addr, raw).await
    }

    /// Sends `raw` and returns the response head (status line and headers),
    /// leaving the connection open, as for an upgrade.
    pub async fn request_head(&self, raw: &str) -> String {
        let mut tcp = TcpStream::connect(self.addr).await.expect("connect");
        tcp.write_all(raw.as_bytes()).await.expect("write");
        let mut out = Vec::new();
        let mut buf = [0u8; 1024];
        while !out.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = within("response head", tcp.read(&mut buf))
                .await
                .expect("read");
            assert!(n > 0, "closed before the head ended");
            assert!(out.len() < 16 * 1024, "head too long");
            out.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The value of one metric line (exact name and labels) in `/metrics`.
    pub async fn metric(&self, series: &str) -> f64 {
        let (_, body) = self.get("/metrics").await;
        body.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
            .map_or(0.0, |v| v.trim().parse().expect("a number"))
    }

    /// Triggers shutdown and waits for `serve` to return.
    pub async fn stop(mut self) -> Result<(), amble::StartError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self.task.take().expect("running");
        within("server shutdown", task).await.expect("server task")
    }

    pub fn trigger_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    pub async fn stopped(mut self) -> Result<(), amble::StartError> {
        let task = self.task.take().expect("running");
        within("server shutdown", task).await.expect("server task")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

pub struct Client {
    pub ws: Ws,
}

/// What a client saw arrive.
#[derive(Debug)]
pub enum Event {
    Message(pb::ServerMessage),
    Closed(Option<CloseFrame>),
}

impl Client {
    pub async fn connect(url: &str) -> Self {
        let mut req = url.into_client_request().expect("request");
        req.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            HeaderValue::from_static(amble::protocol::SUBPROTOCOL),
        );
        let (ws, resp) = within("connect", tokio_tungstenite::connect_async(req))
            .await
            .expect("websocket connect");
        assert_eq!(
            resp.headers()
                .get("sec-websocket-protocol")
                .map(|v| v.as_bytes()),
            Some(amble::protocol::SUBPROTOCOL.as_bytes())
        );
        Self { ws }
    }

    pub fn from_stream(ws: Ws) -> Self {
        Self { ws }
    }

    pub async fn send(&mut self, body: C) {
        self.send_raw(Message::Binary(encode_client(body).into()))
            .await;
    }

    pub async fn send_raw(&mut self, msg: Message) {
        within("send", self.ws.send(msg)).await.expect("send");
    }

    pub async fn send_move(&mut self, x: u32, y: u32, seq: u32) {
        self.send(move_body(Motion::standing(Position { x, y }), seq, 0))
            .await;
    }

    pub async fn join(&mut self, room: &str, name: &str) -> pb::Welcome {
        self.send(C::Join(pb::Join {
            room: room.into(),
            name: name.into(),
            token: String::new(),
        }))
        .await;
        match self.recv().await.body {
            Some(S::Welcome(w)) => w,
            other => panic!("expected Welcome, got {other:?}"),
        }
    }

    /// The next message or close, skipping WebSocket pings and pongs.
    pub async fn event(&mut self) -> Event {
        within("a frame", self.next_event()).await
    }

    /// [`Client::event`] without its time limit, for a caller that bounds
    /// the wait itself.
    pub async fn next_event(&mut self) -> Event {
        loop {
            let next = self.ws.next().await;
            match next {
                Some(Ok(Message::Binary(b))) => {
                    return Event::Message(pb::ServerMessage::decode(b).expect("valid frame"));
                }
                Some(Ok(Message::Close(frame))) => return Event::Closed(frame),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(other)) => panic!("unexpected frame {other:?}"),
                Some(Err(_)) | None => return Event::Closed(None),
            }
        }
    }

    pub async fn recv(&mut self) -> pb::ServerMessage {
        match self.event().await {
            Event::Message(m) => m,
            Event::Closed(f) => panic!("closed: {f:?}"),
        }
    }

    /// Skips messages until `pick` returns something.
    pub async fn until<T>(&mut self, mut pick: impl FnMut(&pb::ServerMessage) -> Option<T>) -> T {
        for _ in 0..10_000 {
            let m = self.recv().await;
            if let Some(t) = pick(&m) {
                return t;
            }
        }
        panic!("gave up after 10,000 messages");
    }

    /// The records of the next motion batch.
    pub async fn next_motion(&mut self) -> Vec<MotionRecord> {
        self.until(|m| (!m.motion.is_empty()).then(|| decode_motion(&m.motion).expect("batch").1))
            .await
    }

    pub async fn expect_error(&mut self, code: pb::ErrorCode) -> String {
        match self.recv().await.body {
            Some(S::Error(e)) if e.code == code as i32 => e.message,
            other => panic!("expected {code:?}, got {other:?}"),
        }
    }

    /// Reads until the server closes; returns the close code.
    pub async fn expect_close(&mut self) -> u16 {
        for _ in 0..10_000 {
            if let Event::Closed(frame) = self.event().await {
                return frame.map_or(1006, |f| f.code.into());
            }
        }
        panic!("no close after 10,000 messages");
    }

    /// Round-trips a Ping: proves the connection is still served.
    pub async fn ping(&mut self) {
        self.send(C::Ping(pb::Ping { client_time_ms: 42 })).await;
        self.until(|m| match &m.body {
            Some(S::Pong(p)) if p.client_time_ms == 42 => Some(()),
            _ => None,
        })
        .await;
    }
}
