//! The images a team's jobs may run (`FLEET_TEAM_IMAGES`, on the workers), as pure rules: per
//! team, and `*` for every team without its own, a list of image ids (`sha256:` and 64 hex
//! digits, what `docker image inspect` says), so a tag moved to another image is not allowed
//! by its name. Once the operator set any, a team with no entry runs no image.

use std::collections::BTreeMap;

/// The entry of every team without one of its own.
pub const ANY_TEAM: &str = "*";

/// The operator's allow-list of images by team; empty: every image (not configured).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImageAllow(BTreeMap<String, Vec<String>>);

fn is_image_id(id: &str) -> bool {
    id.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl ImageAllow {
    /// `{"team-a": ["sha256:…"], "*": ["sha256:…"]}`; empty text: no allow-list.
    pub fn parse(text: &str) -> Result<ImageAllow, String> {
        if text.trim().is_empty() {
            return Ok(ImageAllow::default());
        }
        let map: BTreeMap<String, Vec<String>> =
            serde_json::from_str(text).map_err(|e| format!("team images: {e}"))?;
        for (team, ids) in &map {
            if team != ANY_TEAM {
                crate::auth::check_team(team).map_err(|e| format!("team images: {e}"))?;
            }
            if let Some(bad) = ids.iter().find(|id| !is_image_id(id)) {
                return Err(format!(
                    "team images of `{team}`: `{bad}` is not an image id (sha256: and 64 hex digits)"
                ));
            }
        }
        Ok(ImageAllow(map))
    }

    pub fn is_set(&self) -> bool {
        !self.0.is_empty()
    }

    /// Why a job of `team` may not run `image`, whose id is `id` (`None`: unknown), if so.
    /// A run without a team (the open API) is not limited.
    pub fn refused(&self, team: Option<&str>, image: &str, id: Option<&str>) -> Option<String> {
        let team = team.filter(|_| self.is_set())?;
        let allowed = self.0.get(team).or_else(|| self.0.get(ANY_TEAM));
        match (allowed, id) {
            (Some(ids), Some(id)) if ids.iter().any(|a| a == id) => None,
            (_, id) => Some(format!(
                "image `{image}` ({}) is not allowed for team `{team}`: the operator allows a \
                 team's images by id (FLEET_TEAM_IMAGES)",
                id.unwrap_or("id unknown")
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_team_runs_only_its_images_by_id() {
        let a = format!("sha256:{}", "a".repeat(64));
        let b = format!("sha256:{}", "b".repeat(64));
        let allow = ImageAllow::parse(&format!(r#"{{"team-a": ["{a}"], "*": ["{b}"]}}"#)).unwrap();
        assert!(allow.refused(Some("team-a"), "py", Some(&a)).is_none());
        let why = allow.refused(Some("team-a"), "redis", Some(&b)).unwrap();
        assert!(
            why.contains("`redis`") && why.contains("not allowed"),
            "{why}"
        );
        assert!(allow.refused(Some("other"), "x", Some(&b)).is_none());
        assert!(allow.refused(Some("other"), "x", Some(&a)).is_some());
        assert!(allow.refused(Some("team-a"), "x", None).is_some());
        assert!(allow.refused(None, "x", Some(&b)).is_none());
        let only = ImageAllow::parse(&format!(r#"{{"team-a": ["{a}"]}}"#)).unwrap();
        assert!(
            only.refused(Some("other"), "x", Some(&a)).is_some(),
            "no entry: no image"
        );
        assert!(ImageAllow::default()
            .refused(Some("t"), "x", None)
            .is_none());
        for bad in [r#"{"a": ["fleet-agent-py:1"]}"#, r#"{"A B": []}"#, "[]"] {
            assert!(ImageAllow::parse(bad).is_err(), "{bad}");
        }
    }
}
