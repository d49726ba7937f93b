//! One WebSocket, from the upgrade to its close: the connection loop
//! ([`connection`], with the close codes every ending maps to) and the
//! socket's write side ([`outbox`]), which rooms write into directly, over
//! the socket itself ([`io`], out of the HTTP layer's wrapper). The
//! only code that touches a client socket.

pub mod connection;
pub mod io;
pub mod outbox;
