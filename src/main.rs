//! The `amble` server binary: configuration, logging, signals.

use anyhow::Context as _;
use clap::Parser as _;
use tokio::net::TcpListener;
use tracing::info;
use tracing_subscriber::EnvFilter;

use amble::config::Config;

fn main() -> anyhow::Result<()> {
    let config = Config::parse();
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
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr().context("listener address")?;
    info!(
        %addr,
        "listening: open http://{addr}/ in a browser; load test with \
         `cargo loadtest --url ws://{addr}/ws --bots 1000`"
    );
    amble::serve(listener, config, shutdown_signal())
        .await
        .context("server failed")?;
    Ok(())
}

fn init_tracing(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
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
