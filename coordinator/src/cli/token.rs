//! `fleet token`: API tokens. `create`, `list` and `revoke` go through the API with an admin's
//! token (`FLEET_TOKEN`); `bootstrap` makes a fresh install's first admin token directly in
//! Redis, so only someone who reaches Redis (the operator) can make one without a token.

use super::args::ServerArg;
use super::{Client, Out};
use crate::auth_api::{make_token, TokenCreated};
use crate::store::redis::RedisRunStore;
use clap::{Args, Subcommand};
use shared::auth::Role;
use shared::ports::TokenStore;

#[derive(Subcommand)]
pub enum TokenCmd {
    /// A new token of your team (printed once; only its hash is kept).
    Create(CreateArgs),
    /// Your team's tokens (never their secrets).
    List(ServerOnly),
    /// Revoke a token by its id: it stops working at once.
    Revoke(RevokeArgs),
    /// The first admin token of a team, made directly in Redis (no API token needed; run it
    /// where Redis is reachable).
    Bootstrap(BootstrapArgs),
}

#[derive(Args)]
pub struct CreateArgs {
    /// viewer, member or admin.
    #[arg(long)]
    pub role: String,
    #[arg(long, default_value = "")]
    pub name: String,
    /// The team (only through an open API; a token's team is otherwise its creator's).
    #[arg(long)]
    pub team: Option<String>,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Args)]
pub struct ServerOnly {
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Args)]
pub struct RevokeArgs {
    pub id: String,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Args)]
pub struct BootstrapArgs {
    #[arg(long)]
    pub team: String,
    #[arg(long, default_value = "bootstrap")]
    pub name: String,
    #[arg(long, env = "FLEET_REDIS", default_value = "redis://127.0.0.1:6379")]
    pub redis: String,
    #[arg(long, env = "FLEET_NAMESPACE", default_value = "fleet")]
    pub namespace: String,
}

fn print_created(t: &TokenCreated, out: &mut Out) -> anyhow::Result<()> {
    out.line(&t.token)?;
    eprintln!(
        "token {} for team {} ({:?}); shown once, keep it secret (FLEET_TOKEN)",
        t.view.id, t.view.team, t.view.role
    );
    Ok(())
}

pub async fn run(cmd: TokenCmd, out: &mut Out) -> anyhow::Result<i32> {
    match cmd {
        TokenCmd::Create(a) => {
            let role = Role::parse(&a.role)?;
            let made = Client::new(&a.server.server)
                .create_token(role, &a.name, a.team.as_deref())
                .await?;
            print_created(&made, out)?;
        }
        TokenCmd::List(a) => {
            for t in Client::new(&a.server.server).tokens().await? {
                out.line(format!(
                    "{}  {:<12} {:<7} {:<20} {}{}",
                    t.id,
                    t.team,
                    format!("{:?}", t.role).to_lowercase(),
                    t.name,
                    t.created_at,
                    t.revoked_at
                        .map(|r| format!("  revoked {r}"))
                        .unwrap_or_default()
                ))?;
            }
        }
        TokenCmd::Revoke(a) => {
            let t = Client::new(&a.server.server).revoke_token(&a.id).await?;
            out.line(format!("{}: revoked", t.id))?;
        }
        TokenCmd::Bootstrap(a) => {
            let store = RedisRunStore::connect(&a.redis, &a.namespace)
                .await
                .map_err(|e| anyhow::anyhow!("cannot reach Redis at {}: {e}", a.redis))?;
            let now = chrono::Utc::now();
            let made = make_token(
                &store as &dyn TokenStore,
                now,
                &a.team,
                Role::Admin,
                &a.name,
            )
            .await
            .map_err(|e| anyhow::anyhow!("{}", e.1))?;
            print_created(&made, out)?;
        }
    }
    Ok(0)
}
