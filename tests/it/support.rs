//! The shared harness's test server ([`testkit::TestServer`], on an
//! ephemeral port) and a small protocol client.

use std::time::Duration;

use amble::config::Config;
use amble::protocol::pb::{self, client_message::Body as C, server_message::Body as S};
use amble::protocol::{Motion, MotionRecord, Position, decode_motion, encode_client, move_body};
use futures_util::{SinkExt as _, StreamExt as _};
use prost::Message as _;
pub use testkit::{TestServer, request_at};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long any single wait in a test may take.
pub const WAIT: Duration = Duration::from_secs(10);

pub async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    testkit::within(WAIT, what, fut).await
}

/// A config for tests: the defaults, with whatever `f` changes.
pub fn config(f: impl FnOnce(&mut Config)) -> Config {
    let mut c = Config::default();
    f(&mut c);
    c
}

/// The clients of a [`TestServer`] (the shared harness starts and stops it;
/// these tests speak to it with tokio-tungstenite).
pub(crate) trait Clients {
    /// A client whose socket asks for a tiny (4 KiB) receive window, so that
    /// a test can fill it by not reading.
    async fn narrow_client(&self) -> Client;

    async fn client(&self) -> Client;

    /// A client that has joined `room` as `name`.
    async fn joined(&self, room: &str, name: &str) -> (Client, pb::Welcome);
}

impl Clients for TestServer {
    async fn narrow_client(&self) -> Client {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4_096).expect("SO_RCVBUF");
        let tcp = within("connect", socket.connect(self.addr))
            .await
            .expect("connect");
        let (ws, _) = within(
            "handshake",
            tokio_tungstenite::client_async(self.ws_url(), MaybeTlsStream::Plain(tcp)),
        )
        .await
        .expect("handshake");
        Client::from_stream(ws)
    }

    async fn client(&self) -> Client {
        Client::connect(&self.ws_url()).await
    }

    async fn joined(&self, room: &str, name: &str) -> (Client, pb::Welcome) {
        let mut c = self.client().await;
        let w = c.join(room, name).await;
        (c, w)
    }
}

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

pub struct Client {
    pub ws: Ws,
}

/// What a client saw arrive. Unboxed: one at a time, in tests, so the
/// size of a `ServerMessage` costs nothing worth an allocation each.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
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
            data: Vec::new(),
            start: None,
            room: room.into(),
            name: name.into(),
            token: String::new(),
            resume_token: String::new(),
        }))
        .await;
        self.welcome().await
    }

    /// The next message, which must be a Welcome.
    pub async fn welcome(&mut self) -> pb::Welcome {
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

/// Where `welcome`'s snapshot shows the member it welcomes.
pub fn own_position(welcome: &pb::Welcome) -> Option<pb::Position> {
    welcome
        .snapshot
        .as_ref()?
        .members
        .iter()
        .find(|m| m.id == welcome.member_id)?
        .position
}
