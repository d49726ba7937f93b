//! Integration tests: the real server on 127.0.0.1:0, real WebSocket
//! clients (tokio-tungstenite). Every wait goes through a timeout.

mod api;
mod auth;
mod bad_input;
mod binary;
mod chaos;
mod client_input;
mod cluster;
mod cluster_nats_config;
mod cluster_support;
mod data;
mod handshake;
mod hooks;
mod http;
mod jwks_server;
mod lifecycle;
mod movement;
mod node_sdk;
mod proxy;
mod resume;
mod spatial;
mod support;
