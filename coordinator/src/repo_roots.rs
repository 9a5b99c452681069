//! Which repository paths on the coordinator's own disk a submission may name. A coordinator
//! serving tokens (`fleet coordinator` without `--open-api`) opens none unless an operator
//! allow-lists roots: per team (`FLEET_TEAM_REPO_ROOTS`, `team=/a:/b;other=/c`), which a
//! shared fleet sets so that a team's token opens only its own team's roots, or one list for
//! every caller (`FLEET_REPO_ROOTS`, absolute paths separated by `:`), which a fleet with
//! per-team roots still applies to callers without a team only. A path is taken only when,
//! with every symlink resolved, it lies beneath one of the caller's roots, and so does every
//! place git would read for it (a `.git` file's directory, a common directory, borrowed object
//! stores); a git directory holding a symbolic link anywhere (`.git` itself, `objects/`, a
//! pack) is refused; the canonical path checked is the one opened. The open API (local use)
//! and the embedded mode take any path unless roots are given.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Entries of a git directory looked at for links before the repository is refused as too
/// large to check.
const MAX_GIT_ENTRIES: usize = 500_000;

/// The allow-lists, read once when the coordinator starts.
#[derive(Clone, Debug, Default)]
pub struct RepoRoots {
    /// Canonical roots; `None` when none were given.
    roots: Option<Vec<PathBuf>>,
    /// Canonical roots per team; `None` when none were given (then teams use `roots`).
    teams: Option<BTreeMap<String, Vec<PathBuf>>>,
}

/// Canonical absolute roots; those that do not exist are left out (with a warning).
fn canonical_roots<'a>(roots: impl IntoIterator<Item = &'a str>) -> Vec<PathBuf> {
    roots
        .into_iter()
        .filter(|r| !r.trim().is_empty())
        .filter_map(|r| match Path::new(r.trim()).canonicalize() {
            Ok(p) if Path::new(r.trim()).is_absolute() => Some(p),
            _ => {
                tracing::warn!(root = %r, "repository root left out: not an absolute path that exists");
                None
            }
        })
        .collect()
}

impl RepoRoots {
    /// `FLEET_REPO_ROOTS` and `FLEET_TEAM_REPO_ROOTS`.
    pub fn from_env() -> RepoRoots {
        let mut roots = match std::env::var("FLEET_REPO_ROOTS") {
            Ok(text) => RepoRoots::new(text.split(':')),
            Err(_) => RepoRoots::default(),
        };
        if let Ok(text) = std::env::var("FLEET_TEAM_REPO_ROOTS") {
            roots = roots.with_teams(&text);
        }
        roots
    }

    pub fn new<'a>(roots: impl IntoIterator<Item = &'a str>) -> RepoRoots {
        RepoRoots {
            roots: Some(canonical_roots(roots)),
            teams: None,
        }
    }

    /// These roots with roots per team, `team=/a:/b;other=/c` (an entry without `=` is left
    /// out with a warning).
    pub fn with_teams(mut self, spec: &str) -> RepoRoots {
        let mut teams = BTreeMap::new();
        for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            match entry.split_once('=') {
                Some((team, roots)) if !team.trim().is_empty() => {
                    let list: &mut Vec<PathBuf> = teams.entry(team.trim().to_string()).or_default();
                    list.extend(canonical_roots(roots.split(':')));
                }
                _ => {
                    tracing::warn!(entry = %entry, "team repository roots left out: not `team=/root:/root`")
                }
            }
        }
        self.teams = Some(teams);
        self
    }

    /// The roots a caller of `team` may open (`None`: any path, the open API without roots).
    fn roots_of(&self, team: Option<&str>, open: bool) -> Result<Option<&[PathBuf]>, String> {
        match (team, &self.teams, &self.roots) {
            (Some(team), Some(teams), _) => match teams.get(team) {
                Some(roots) => Ok(Some(roots)),
                None => Err(format!(
                    "team `{}` may open no repository path on this coordinator's disk: an \
                     operator gives a team its roots with FLEET_TEAM_REPO_ROOTS; upload the \
                     repository instead",
                    shared::text::head(team, 80)
                )),
            },
            (_, _, Some(roots)) => Ok(Some(roots)),
            (_, _, None) if open => Ok(None),
            (_, _, None) => Err(
                "this coordinator opens no repository path on its own disk: an operator \
                 allow-lists roots with FLEET_REPO_ROOTS or FLEET_TEAM_REPO_ROOTS"
                    .to_string(),
            ),
        }
    }

    /// The canonical path of `repo` when a caller of `team` may open it; `open` says whether
    /// the API is open (local use). The error says why not.
    pub fn check(&self, repo: &str, team: Option<&str>, open: bool) -> Result<PathBuf, String> {
        let shown = shared::text::head(repo, 200);
        let roots = self.roots_of(team, open)?;
        let path = Path::new(repo);
        let Some(roots) = roots else {
            // Any path (local use): as git would open it, errors and all.
            return Ok(path.canonicalize().unwrap_or_else(|_| path.to_path_buf()));
        };
        if !path.is_absolute() {
            return Err(format!("repository `{shown}` is not an absolute path"));
        }
        // Every symlink resolved: a link beneath a root that leads out of it is outside.
        let real = path
            .canonicalize()
            .map_err(|_| format!("repository `{shown}` cannot be opened"))?;
        let beneath = |p: &Path| roots.iter().any(|root| p.starts_with(root));
        let outside = || {
            format!(
                "repository `{shown}` is not beneath a root this coordinator allows the caller \
                 (FLEET_TEAM_REPO_ROOTS, FLEET_REPO_ROOTS)"
            )
        };
        if !beneath(&real) {
            return Err(outside());
        }
        // Where git itself would read: a `.git` file's directory, a worktree's common
        // directory, borrowed object stores (alternates). Each must be beneath a root too.
        for (what, path) in git_indirections(&real) {
            let resolved = path.canonicalize().unwrap_or(path.clone());
            if !beneath(&resolved) {
                return Err(format!(
                    "repository `{shown}`: its {what} `{}` is not beneath a root this \
                     coordinator allows the caller (FLEET_TEAM_REPO_ROOTS, FLEET_REPO_ROOTS)",
                    shared::text::head(&path.display().to_string(), 200)
                ));
            }
        }
        // No link git would follow out of what was checked: `.git` itself, `objects/`, a
        // pack or a loose object that is a symbolic link.
        for dir in git_dirs(&real) {
            if let Some(link) = first_link(&dir)? {
                return Err(format!(
                    "repository `{shown}`: its git directory holds a symbolic link (`{}`); \
                     a repository opened on the server holds none",
                    shared::text::head(&link, 200)
                ));
            }
        }
        Ok(real)
    }
}

/// The git directories of the repository at `real` to look for links in: `.git` as it stands
/// (a link itself is found), the directory a `.git` file names, a common directory.
fn git_dirs(real: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![real.join(".git")];
    for (what, path) in git_indirections(real) {
        if what != "borrowed object store" {
            dirs.push(path);
        }
    }
    if !real.join(".git").exists() {
        // A bare repository: the folder is the git directory.
        dirs.push(real.to_path_buf());
    }
    dirs
}

/// The first symbolic link at or beneath `dir` (not followed), as a path relative to `dir`'s
/// parent; `None` when there is none (or `dir` does not exist). A directory too large to check
/// is refused.
fn first_link(dir: &Path) -> Result<Option<String>, String> {
    let shown = |p: &Path| {
        let base = dir.parent().unwrap_or(dir);
        p.strip_prefix(base).unwrap_or(p).display().to_string()
    };
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = 0usize;
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        seen += 1;
        if seen > MAX_GIT_ENTRIES {
            return Err(format!(
                "the git directory has over {MAX_GIT_ENTRIES} entries: too large to check"
            ));
        }
        if meta.file_type().is_symlink() {
            return Ok(Some(shown(&path)));
        }
        if meta.is_dir() {
            let entries = std::fs::read_dir(&path)
                .map_err(|_| format!("the git directory `{}` cannot be read", shown(&path)))?;
            stack.extend(entries.flatten().map(|e| e.path()));
        }
    }
    Ok(None)
}

/// The places git reads for the repository at `real` beyond the folder itself: the directory
/// a `.git` file names, a linked worktree's common directory, and every object store listed in
/// `objects/info/alternates` (relative entries resolved as git does). Bounded reads.
fn git_indirections(real: &Path) -> Vec<(&'static str, PathBuf)> {
    let read = |p: &Path| -> Option<String> {
        let meta = std::fs::metadata(p).ok()?;
        (meta.is_file() && meta.len() <= 64 * 1024).then(|| std::fs::read_to_string(p).ok())?
    };
    let mut out = Vec::new();
    let dot_git = real.join(".git");
    let gitdir = match read(&dot_git) {
        Some(text) => {
            let named = text.trim().strip_prefix("gitdir:").unwrap_or("").trim();
            let dir = real.join(named);
            out.push(("git directory", dir.clone()));
            dir
        }
        None if dot_git.is_dir() => dot_git,
        None => real.to_path_buf(),
    };
    let mut object_dirs = vec![gitdir.join("objects")];
    if let Some(common) = read(&gitdir.join("commondir")) {
        let common = gitdir.join(common.trim());
        out.push(("common git directory", common.clone()));
        object_dirs.push(common.join("objects"));
    }
    for objects in object_dirs {
        if let Some(list) = read(&objects.join("info/alternates")) {
            for line in list.lines().map(str::trim) {
                if !line.is_empty() && !line.starts_with('#') {
                    out.push(("borrowed object store", objects.join(line)));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_roots_only_the_open_api_takes_a_path() {
        let none = RepoRoots::default();
        let tmp = std::env::temp_dir();
        let tmp = tmp.to_str().unwrap();
        assert!(none.check(tmp, None, true).is_ok());
        let e = none.check(tmp, None, false).unwrap_err();
        assert!(e.contains("FLEET_REPO_ROOTS"), "{e}");
    }

    #[test]
    fn a_root_that_does_not_exist_or_is_relative_is_left_out() {
        let roots = RepoRoots::new(["/no/such/root", "relative/x"]);
        assert!(roots.check("/no/such/root/repo", None, true).is_err());
    }

    #[test]
    fn a_team_opens_only_its_own_roots_once_teams_have_roots() {
        let base = std::env::temp_dir().join(format!("repo-roots-{}", std::process::id()));
        let (a, b) = (base.join("a"), base.join("b"));
        std::fs::create_dir_all(a.join("repo")).unwrap();
        std::fs::create_dir_all(b.join("repo")).unwrap();
        let all = base.to_str().unwrap();
        let teams = format!("team-a={};team-b={}", a.display(), b.display());
        let roots = RepoRoots::new([all]).with_teams(&teams);
        let b_repo = b.join("repo").display().to_string();
        let e = roots.check(&b_repo, Some("team-a"), false).unwrap_err();
        assert!(e.contains("not beneath"), "{e}");
        assert!(roots.check(&b_repo, Some("team-b"), false).is_ok());
        let e = roots.check(&b_repo, Some("team-c"), false).unwrap_err();
        assert!(e.contains("FLEET_TEAM_REPO_ROOTS"), "{e}");
        // A caller without a team (the open API) keeps the fleet's roots.
        assert!(roots.check(&b_repo, None, true).is_ok());
        let _ = std::fs::remove_dir_all(&base);
    }
}
