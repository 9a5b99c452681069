use clap::Parser;
use coordinator::cli::{log_json, Cli};
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// Logs go to stderr: JSON lines when asked for, otherwise text, coloured only on a terminal
/// (a log file or a pipe gets no escape codes).
fn init_logging(json: bool) {
    let filter = EnvFilter::try_from_env("FLEET_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        logs.json().with_ansi(false).init();
    } else {
        logs.with_ansi(std::io::stderr().is_terminal()).init();
    }
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let format = std::env::var("FLEET_LOG_FORMAT").ok();
    let json = log_json(cli.log_json, format.as_deref());
    init_logging(json);
    match coordinator::cli::main(cli).await {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            if json {
                // Every line on stderr stays JSON for whoever parses the logs (whatever the
                // filter lets through).
                let line = serde_json::json!({
                    "timestamp": chrono::Utc::now().to_rfc3339(),
                    "level": "ERROR",
                    "fields": {"message": format!("error: {e:#}")},
                    "target": "fleet",
                });
                eprintln!("{line}");
            } else {
                eprintln!("error: {e:#}");
            }
            std::process::exit(2);
        }
    }
}
