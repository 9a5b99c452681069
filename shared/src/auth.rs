//! Who may call the API, as pure rules: API tokens (random, shown once, stored only as their
//! SHA-256), each scoped to a team and a role; what each role may do (`Access` of a route);
//! the team's own run ids (the same submission by two teams makes two runs).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

/// What a token may do, from least to most.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reads its team's runs, batches, schedules and artifacts.
    Viewer,
    /// Also submits, cancels, approves and decides quarantine.
    Member,
    /// Also creates and revokes its team's tokens.
    Admin,
}

impl Role {
    pub fn parse(s: &str) -> Result<Role, AuthError> {
        match s {
            "viewer" => Ok(Role::Viewer),
            "member" => Ok(Role::Member),
            "admin" => Ok(Role::Admin),
            other => Err(AuthError::Role(other.to_string())),
        }
    }
}

/// What a route needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// No token (health, metrics, the API's own description).
    Public,
    /// A viewer's token or better.
    Read,
    /// A member's token or better.
    Write,
    /// An admin's token.
    Admin,
}

impl Access {
    pub fn allows(self, role: Role) -> bool {
        match self {
            Access::Public | Access::Read => true,
            Access::Write => role >= Role::Member,
            Access::Admin => role == Role::Admin,
        }
    }
}

/// Who made a decision (an approval, a quarantine's), as recorded: the token's id first,
/// whatever the request says after it; through the open API, what the request says.
pub fn decided_by(p: &Principal, said: &str) -> String {
    match (&p.token_id, said.is_empty()) {
        (None, _) => said.to_string(),
        (Some(id), true) => format!("token {id}"),
        (Some(id), false) => format!("token {id}: {said}"),
    }
}

/// A token as stored: never the token itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRecord {
    /// A short public id (to list and revoke it).
    pub id: String,
    /// SHA-256 of the token, hex.
    pub hash: String,
    pub team: String,
    pub role: Role,
    pub name: String,
    pub created_at: DateTime<Utc>,
    #[serde(default)]
    pub revoked_at: Option<DateTime<Utc>>,
}

/// The caller of a request: a token's team and role, or the open API (no team: everything).
#[derive(Clone, Debug, PartialEq)]
pub struct Principal {
    pub team: Option<String>,
    pub role: Role,
    pub token_id: Option<String>,
}

impl Principal {
    /// The API opened explicitly for local use (`--open-api`): one admin over every team.
    pub fn open() -> Principal {
        Principal {
            team: None,
            role: Role::Admin,
            token_id: None,
        }
    }

    /// Whether something of `owner` (a run's, a batch's, a schedule's team) is visible.
    pub fn sees(&self, owner: Option<&str>) -> bool {
        match &self.team {
            None => true,
            Some(team) => owner == Some(team.as_str()),
        }
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum AuthError {
    #[error("unknown role `{0}` (viewer, member or admin)")]
    Role(String),
    #[error("team `{0}`: use 1 to 40 lowercase letters, digits, `-` or `_`")]
    Team(String),
    #[error("token name: at most 100 characters, no control characters")]
    Name,
}

/// Tokens look like `fleet_<64 hex>`.
pub const TOKEN_PREFIX: &str = "fleet_";

/// A token from 32 random bytes (the caller draws them).
pub fn token_from(bytes: &[u8; 32]) -> String {
    format!("{TOKEN_PREFIX}{}", hex::encode(bytes))
}

/// The stored form of a token.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The `Authorization` header's token (`Bearer <token>`), if it is one at all.
pub fn bearer(header: &str) -> Option<&str> {
    let token = header.strip_prefix("Bearer ")?.trim();
    (token.starts_with(TOKEN_PREFIX) && token.len() == TOKEN_PREFIX.len() + 64).then_some(token)
}

pub fn check_team(team: &str) -> Result<(), AuthError> {
    let ok = (1..=40).contains(&team.len())
        && team
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(AuthError::Team(team.chars().take(60).collect()))
    }
}

pub fn check_name(name: &str) -> Result<(), AuthError> {
    if name.chars().count() <= 100 && !name.chars().any(char::is_control) {
        Ok(())
    } else {
        Err(AuthError::Name)
    }
}

/// The mark every run id of a team ends with: `-t` and 10 hex digits of the team's name's
/// hash. No other team's id ends with it, so a team can neither take nor probe another's ids.
pub fn team_mark(team: &str) -> String {
    let h = hex::encode(Sha256::digest(format!("fleet-team\n{team}").as_bytes()));
    format!("-t{}", &h[..10])
}

/// How long a run id a team chooses may be: 64 less its team's mark.
pub const TEAM_CHOSEN_RUN_ID_MAX: usize = 64 - 12;

/// A run id of `team`: the id derived from the submission or chosen by the submitter, made
/// the team's own by its mark (an id that has it already is kept, so the id given back names
/// the same run again). A team's submission never names, nor returns, another team's run,
/// and whether another team has an id never changes the answer. No team: the id as given.
pub fn team_run_id(id: &str, team: Option<&str>) -> String {
    match team {
        None => id.to_string(),
        Some(team) => {
            let mark = team_mark(team);
            if id.ends_with(&mark) {
                id.to_string()
            } else {
                format!("{id}{mark}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_allow_what_their_access_needs() {
        assert!(Access::Read.allows(Role::Viewer));
        assert!(!Access::Write.allows(Role::Viewer));
        assert!(Access::Write.allows(Role::Member));
        assert!(!Access::Admin.allows(Role::Member));
        assert!(Access::Admin.allows(Role::Admin));
        assert_eq!(Role::parse("root"), Err(AuthError::Role("root".into())));
    }

    #[test]
    fn only_well_formed_bearer_tokens_are_read() {
        let t = token_from(&[7; 32]);
        assert_eq!(bearer(&format!("Bearer {t}")), Some(t.as_str()));
        assert_eq!(bearer(&t), None);
        assert_eq!(bearer("Bearer fleet_short"), None);
        assert_eq!(bearer(&format!("Basic {t}")), None);
        assert_ne!(hash_token(&t), t);
        assert_eq!(hash_token(&t).len(), 64);
    }

    #[test]
    fn a_team_sees_only_its_own_and_the_open_api_sees_all() {
        let a = Principal {
            team: Some("a".into()),
            role: Role::Viewer,
            token_id: None,
        };
        assert!(a.sees(Some("a")));
        assert!(!a.sees(Some("b")));
        assert!(!a.sees(None), "a run of the open API is no team's");
        assert!(Principal::open().sees(Some("b")));
    }

    #[test]
    fn the_same_submission_by_two_teams_makes_two_runs() {
        let derived = "0123456789ab";
        let a = team_run_id(derived, Some("a"));
        assert_ne!(a, team_run_id(derived, Some("b")));
        assert_eq!(a.len(), derived.len() + 12);
        assert_eq!(team_run_id(&a, Some("a")), a, "a team's own id is kept");
        let b_id = team_run_id("nightly", Some("b"));
        assert_ne!(
            team_run_id(&b_id, Some("a")),
            b_id,
            "another team's id is never taken"
        );
        assert_eq!(team_run_id(derived, None), derived);
        assert!(crate::factory::valid_run_id(&team_run_id(
            &"x".repeat(52),
            Some("a")
        )));
        assert!(check_team("Team A").is_err());
        assert!(check_team("ml-evals").is_ok());
    }

    #[test]
    fn a_decision_is_the_tokens_whatever_the_request_says() {
        let p = Principal {
            team: Some("a".into()),
            role: Role::Member,
            token_id: Some("t1".into()),
        };
        assert_eq!(decided_by(&p, "lead"), "token t1: lead");
        assert_eq!(decided_by(&p, ""), "token t1");
        assert_eq!(decided_by(&Principal::open(), "ana"), "ana");
    }
}
