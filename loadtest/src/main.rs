//! `loadtest`: see the crate docs and `loadtest --help`.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser as _;
use loadtest::Unreachable;
use loadtest::{Opts, Stop};

/// Exit status when thresholds given on the command line were missed.
const MISSED: u8 = 1;
/// Exit status when the run failed or could not be made (server
/// unreachable, bad options, bots disconnected or unable to connect, a
/// child failed).
const FAILED: u8 = 2;

#[tokio::main]
async fn main() -> ExitCode {
    let opts = Opts::parse();
    let stop = Stop::new();
    stop.on_signals();
    if let Some(plan) = &opts.child {
        stop.on_stdin_closed();
        let code = match loadtest::run_child(plan, &stop).await {
            Ok(()) => 0,
            Err(err) => {
                eprintln!("loadtest child: {err:#}");
                i32::from(FAILED)
            }
        };
        // At once: the runtime's shutdown would wait for the blocking read
        // of stdin, which ends only when the parent closes it.
        std::process::exit(code);
    }
    let signalled = stop.clone();
    tokio::spawn(async move {
        let why = signalled.stopped().await;
        eprintln!(
            "loadtest: {why}: stopping the bots; the report of what was measured follows \
             (a second {why} quits at once)"
        );
    });
    let report = loadtest::run_with(&opts, None, stop.clone()).await;
    let report = match report {
        Ok(report) => report,
        Err(err) => {
            match err.downcast_ref::<Unreachable>() {
                Some(unreachable) => eprintln!("loadtest: {unreachable}"),
                None => eprintln!("loadtest: {err:#}"),
            }
            return ExitCode::from(match stop.reason() {
                Some(why) => loadtest::stop::exit_status(why),
                None => FAILED,
            });
        }
    };
    // With `--json -` stdout is the JSON alone; the readable report moves to stderr.
    if opts.json.as_deref().is_some_and(|p| p.as_os_str() == "-") {
        eprintln!("{report}");
    } else {
        println!("{report}");
    }
    if let Some(path) = &opts.json
        && let Err(err) = write_json(&report, path)
    {
        eprintln!("loadtest: {err:#}");
        return ExitCode::from(FAILED);
    }
    if let Some(why) = report.interrupted() {
        eprintln!("loadtest: interrupted by {why}");
        return ExitCode::from(loadtest::stop::exit_status(why));
    }
    if let Some(first) = report.failures().first() {
        eprintln!("loadtest: the run failed: {first}");
        return ExitCode::from(FAILED);
    }
    let missed = report.missed(&opts);
    if missed.is_empty() {
        return ExitCode::SUCCESS;
    }
    for m in &missed {
        eprintln!("loadtest: threshold missed: {m}");
    }
    ExitCode::from(MISSED)
}

fn write_json(report: &loadtest::Report, path: &std::path::Path) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(report)?;
    if path.as_os_str() == "-" {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{json}")?;
        return Ok(());
    }
    std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))
}
