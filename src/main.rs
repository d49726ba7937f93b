//! The `amble` server binary: configuration, logging, signals.

use std::net::SocketAddr;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tracing::info;
use tracing_subscriber::EnvFilter;

use amble::config::{Cli, Config, TokenArgs, Tool};

fn main() -> anyhow::Result<()> {
    let cli = amble::config::parse_or_exit::<Cli>();
    let config = match cli.command {
        Some(Tool::Token(args)) => return print_token(&args, &cli.config),
        None => cli.config,
    };
    init_tracing(config.log_json);
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if config.workers > 0 {
        runtime.worker_threads(usize::from(config.workers));
    }
    runtime
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?
        .block_on(run(config))
}

async fn run(config: Config) -> anyhow::Result<()> {
    amble::raise_open_files_limit();
    let listener = TcpListener::bind(config.edge.listen.to_bind())
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (set --listen or AMBLE_LISTEN to a free address)",
                config.edge.listen
            )
        })?;
    let addr = listener.local_addr().context("listener address")?;
    // Said once the server serves: a configuration error (a key file, the
    // cluster) stops it before, and then this line would mislead.
    let announce = move |_: amble::Started| {
        let near = reachable_here(addr);
        if addr.ip().is_unspecified() {
            info!(
                %addr,
                "listening on every interface: open http://{near}/ here, or this machine's \
                 address and port {} from elsewhere; load test with \
                 `cargo loadtest --url ws://{near}/ws --bots 1000`",
                addr.port()
            );
        } else {
            info!(
                %addr,
                "listening: open http://{near}/ in a browser; load test with \
                 `cargo loadtest --url ws://{near}/ws --bots 1000`"
            );
        }
    };
    amble::serve_started(listener, config, shutdown_signal(), announce)
        .await
        .context("server failed")?;
    Ok(())
}

/// An address a user on this machine can open for `addr`: a wildcard
/// address (0.0.0.0, ::) is not one, so it becomes the loopback address of
/// its family.
fn reachable_here(addr: SocketAddr) -> SocketAddr {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    SocketAddr::new(ip, addr.port())
}

/// `amble token`: prints a signed token on stdout.
fn print_token(args: &TokenArgs, config: &Config) -> anyhow::Result<()> {
    use amble::auth;
    let secret = auth::read_secret(&args.secret_file, "--secret-file")?;
    let rules = config.rules();
    let name = args
        .name
        .clone()
        .map(|name| amble::protocol::validate_name(name, &rules))
        .transpose()
        .context("--name")?;
    if let Some(rooms) = &args.rooms {
        for pattern in rooms {
            auth::check_room_pattern(pattern, &rules)
                .with_context(|| format!("--rooms: {pattern:?}"))?;
        }
    }
    let data = if args.data.is_empty() {
        None
    } else {
        let map: serde_json::Map<String, serde_json::Value> = args
            .data
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str())))
            .collect();
        anyhow::ensure!(map.len() == args.data.len(), "--data: a key appears twice");
        let claim = serde_json::Value::Object(map);
        auth::data_claim(claim.clone(), &rules).map_err(|why| anyhow::anyhow!("--data: {why}"))?;
        Some(claim)
    };
    let claims = auth::Claims {
        sub: args.sub.clone(),
        exp: auth::unix_now() + args.ttl.as_secs(),
        name,
        rooms: args.rooms.clone(),
        start: None,
        data,
        share_sub: args.share_sub,
    };
    anyhow::ensure!(
        !claims.sub.is_empty() && claims.sub.len() <= auth::MAX_SUB_BYTES,
        "--sub: 1 to {} bytes",
        auth::MAX_SUB_BYTES
    );
    let token = auth::mint_hs256(&secret, &claims).context("cannot sign the token")?;
    println!("{token}");
    Ok(())
}

fn init_tracing(json: bool) {
    // async-nats logs every failed reconnect at INFO ("IO error", once a
    // second while NATS is away); amble says what matters itself (waiting
    // for NATS, the connection lost and back), once. RUST_LOG overrides.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,async_nats=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        use std::io::IsTerminal as _;
        builder.with_ansi(std::io::stderr().is_terminal()).init();
    }
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM (what Docker sends).
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => info!("SIGINT"),
        () = term => info!("SIGTERM"),
    }
}
