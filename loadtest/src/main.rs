//! `loadtest`: see the crate docs and `loadtest --help`.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser as _;
use loadtest::Opts;
use loadtest::load::Unreachable;

/// Exit status when thresholds given on the command line were missed.
const MISSED: u8 = 1;
/// Exit status when the run could not be made (server unreachable, bad
/// options, a child failed).
const FAILED: u8 = 2;

#[tokio::main]
async fn main() -> ExitCode {
    let opts = Opts::parse();
    if let Some(plan) = &opts.child {
        return match loadtest::run_child(plan).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("loadtest child: {err:#}");
                ExitCode::from(FAILED)
            }
        };
    }
    let report = tokio::select! {
        report = loadtest::run_with(&opts, None) => report,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("loadtest: interrupted");
            return ExitCode::from(130);
        }
    };
    let report = match report {
        Ok(report) => report,
        Err(err) => {
            match err.downcast_ref::<Unreachable>() {
                Some(unreachable) => eprintln!("loadtest: {unreachable}"),
                None => eprintln!("loadtest: {err:#}"),
            }
            return ExitCode::from(FAILED);
        }
    };
    // With `--json -` stdout is the JSON alone; the readable report moves to stderr.
    if opts.json.as_deref().is_some_and(|p| p.as_os_str() == "-") {
        eprintln!("{report}");
    } else {
        println!("{report}");
    }
    if let Some(path) = &opts.json {
        if let Err(err) = write_json(&report, path) {
            eprintln!("loadtest: {err:#}");
            return ExitCode::from(FAILED);
        }
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
