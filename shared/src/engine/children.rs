//! Child runs: a `spawn` node starts one run of the same graph per item of its list, each a
//! real run with its own id, linked to this one ([`TreeLink`]), and waits for them
//! ([`ChildGroup`]); their ends come back as [`Event::ChildFinished`](super::Event) and the
//! node routes once the group is settled. A run that ends cancels the children it still waits
//! for, so cancellation cascades down the tree.
//!
//! Bounds hold without a shared counter: the tree's depth is carried by each link, and each
//! run holds a budget of runs it may still start (the root: `max_runs - 1`); a spawn spends one
//! per child and hands each child an equal share of what is left, and a child that ends gives
//! back what it did not use. So the tree never holds more than `max_runs` runs.

use super::state::{NewRun, Outcome, RunState, RunStatus};
use super::step::Engine;
use super::EngineError;
use crate::expr;
use crate::graph::SpawnBody;
use crate::hashing::sha256_hex;
use crate::ids::{NodeId, RunId};
use crate::messages::{RepoSnapshot, Usage};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Where a child run sits in its tree (also as the status view shows it).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct TreeLink {
    pub root: RunId,
    pub parent: RunId,
    /// The parent's spawn node and its visit that started this run.
    pub node: NodeId,
    pub visit: u32,
    /// The item's place in the spawn's list.
    pub index: u32,
    /// The root is depth 0.
    pub depth: u32,
}

/// A child run as its parent's spawn decided it; the driver creates and starts it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ChildRun {
    #[serde(flatten)]
    pub run: NewRun,
    pub tree: TreeLink,
    /// Runs the child may start below itself.
    pub budget: u32,
}

/// How a child run ended, as its parent hears it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ChildReport {
    pub parent: RunId,
    pub child: RunId,
    pub node: NodeId,
    pub visit: u32,
    pub index: u32,
    pub status: RunStatus,
    pub result: Value,
    /// The child's latest commit (its work), if it made one.
    pub head: Option<String>,
    /// Packs holding the child's commits, for the parent's later worktrees.
    pub packs: Vec<String>,
    /// What the child did not spend of its budget.
    pub budget_left: u32,
    pub usage: Usage,
}

/// One spawn's children, as the parent waits for them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ChildGroup {
    pub node: NodeId,
    pub visit: u32,
    pub branch: Option<u32>,
    /// The commit the children start from.
    #[serde(default)]
    pub base: String,
    pub first_failure: bool,
    /// Set once the group is settled (every child ended, or the first failure).
    pub settled: bool,
    /// Sibling events relayed to this group's children, by id.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub relayed: std::collections::BTreeSet<String>,
    pub children: Vec<ChildRecord>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ChildRecord {
    pub run_id: RunId,
    pub item: Value,
    /// The child's input (from the item and the spawn's `input`).
    #[serde(default)]
    pub input: Value,
    /// None while the child runs.
    pub status: Option<RunStatus>,
    #[serde(default)]
    pub result: Value,
    #[serde(default)]
    pub head: Option<String>,
    pub share: u32,
}

impl ChildReport {
    /// A child that failed before it ran (its parent hears `reason`).
    pub fn failed_before_start(link: &TreeLink, child: &RunId, reason: &str) -> Self {
        ChildReport {
            parent: link.parent.clone(),
            child: child.clone(),
            node: link.node.clone(),
            visit: link.visit,
            index: link.index,
            status: RunStatus::Failed,
            result: json!({ "reason": reason }),
            head: None,
            packs: Vec::new(),
            budget_left: 0,
            usage: Usage::default(),
        }
    }
}

impl ChildGroup {
    /// The key of a group in the run state: `<node>.<visit>`.
    pub fn key(node: &NodeId, visit: u32) -> String {
        format!("{node}.{visit}")
    }

    /// Children that have not ended.
    pub fn running(&self) -> impl Iterator<Item = &ChildRecord> {
        self.children.iter().filter(|c| c.status.is_none())
    }
}

/// A child's run id: the parent's, the spawn node, its visit and the item's index, when that
/// fits the 64 characters a run id may have; otherwise a prefix of the parent's and a hash.
pub fn child_run_id(parent: &RunId, node: &NodeId, visit: u32, index: usize) -> RunId {
    let plain = format!("{parent}-{node}-{visit}-{index}");
    let ok = plain.len() <= 64
        && plain
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        return RunId::new(plain);
    }
    let hash = sha256_hex(plain.as_bytes());
    let keep: String = parent.as_str().chars().take(40).collect();
    RunId::new(format!("{keep}-{}", &hash[..20]))
}

/// Why a spawn started no children; the node's outcome fails with it and routes on.
fn refusal(reason: &str, detail: Value) -> Value {
    json!({"refused": reason, "detail": detail, "children": [], "count": 0})
}

impl RunState {
    /// Runs this run may still start below itself: what its parent handed it, or for the root
    /// the tree's whole allowance less itself.
    pub fn spawn_budget(&self, max_runs: u32) -> u32 {
        self.spawn_budget.unwrap_or(max_runs.saturating_sub(1))
    }

    /// The child run of `group`'s `index`-th record, as this run's spawn decided it (and as it
    /// is asked for again after a restore).
    pub fn child_run(&self, group: &ChildGroup, index: usize) -> ChildRun {
        let record = &group.children[index];
        let mut meta = self.meta.clone();
        if meta.get("run_id").is_some() {
            meta["run_id"] = json!(record.run_id);
        }
        ChildRun {
            run: NewRun {
                run_id: record.run_id.clone(),
                graph_ref: self.graph_ref.clone(),
                input: record.input.clone(),
                meta,
                repo: RepoSnapshot {
                    url: self.repo.url.clone(),
                    base_commit: group.base.clone(),
                    packs: self.repo.packs.clone(),
                },
                agent: self.agent.clone(),
            },
            tree: TreeLink {
                root: self
                    .tree
                    .as_ref()
                    .map(|t| t.root.clone())
                    .unwrap_or_else(|| self.run_id.clone()),
                parent: self.run_id.clone(),
                node: group.node.clone(),
                visit: group.visit,
                index: index as u32,
                depth: self.depth() + 1,
            },
            budget: record.share,
        }
    }

    /// Children every unsettled spawn still waits for, as their runs were decided.
    pub fn open_children(&self) -> Vec<ChildRun> {
        self.children
            .values()
            .filter(|g| !g.settled)
            .flat_map(|g| {
                (0..g.children.len())
                    .filter(|i| g.children[*i].status.is_none())
                    .map(|i| self.child_run(g, i))
            })
            .collect()
    }

    /// Whether `commit` is one this run has seen: its base, a step's, a child's head, or a
    /// sibling event's.
    pub fn knows_commit(&self, commit: &str) -> bool {
        self.repo.base_commit == commit
            || self
                .history
                .iter()
                .any(|o| o.commit.as_deref() == Some(commit))
            || self
                .children
                .values()
                .flat_map(|g| &g.children)
                .any(|c| c.head.as_deref() == Some(commit))
            || self
                .sibling_events
                .iter()
                .any(|e| e.payload["commit"].as_str() == Some(commit))
    }

    /// The spawn group and the record of child `run` at `index` of the spawn visit, while that
    /// child has not reported.
    pub fn open_child(
        &self,
        node: &NodeId,
        visit: u32,
        index: u32,
        run: &RunId,
    ) -> Option<(&ChildGroup, &ChildRecord)> {
        let group = self.children.get(&ChildGroup::key(node, visit))?;
        let record = group
            .children
            .get(index as usize)
            .filter(|c| &c.run_id == run && c.status.is_none())?;
        Some((group, record))
    }

    pub fn depth(&self) -> u32 {
        self.tree.as_ref().map(|t| t.depth).unwrap_or(0)
    }

    /// The report of this (ended) child run for its parent; none for a root.
    pub fn child_report(&self) -> Option<ChildReport> {
        let link = self.tree.as_ref()?;
        let head = self
            .history
            .iter()
            .rev()
            .find_map(|o| o.commit.clone())
            .filter(|c| *c != self.repo.base_commit);
        Some(ChildReport {
            parent: link.parent.clone(),
            child: self.run_id.clone(),
            node: link.node.clone(),
            visit: link.visit,
            index: link.index,
            status: self.status,
            result: self.result.clone().unwrap_or(Value::Null),
            head,
            packs: self.repo.packs.clone(),
            budget_left: self.spawn_budget.unwrap_or(0),
            usage: self.usage,
        })
    }
}

impl Engine<'_> {
    /// Enters a spawn node: the children it starts, or its refusal as a failed outcome.
    pub(super) fn spawn(
        &mut self,
        id: &NodeId,
        spawn: &SpawnBody,
        visit: u32,
        branch: Option<u32>,
    ) -> Result<(), EngineError> {
        let mut ctx = self.state.context_in(branch);
        let err = Self::expr_err(id);
        let items = match expr::eval(&spawn.over, &ctx).map_err(&err)? {
            Value::Array(items) => items,
            Value::Null => Vec::new(),
            other => vec![other],
        };
        let limits = self.bundle.graph.defaults.tree;
        let budget = self.state.spawn_budget(limits.max_runs);
        let depth = self.state.depth() + 1;
        let refused = if items.len() > crate::limits::MAX_FANOUT {
            Some(refusal(
                "too_many_children",
                json!({"items": items.len(), "limit": crate::limits::MAX_FANOUT}),
            ))
        } else if !items.is_empty() && depth > limits.max_depth {
            Some(refusal(
                "tree_depth_limit",
                json!({"depth": depth, "max_depth": limits.max_depth}),
            ))
        } else if items.len() as u64 > budget as u64 {
            Some(refusal(
                "tree_run_limit",
                json!({"children": items.len(), "runs_left": budget,
                       "max_runs": limits.max_runs}),
            ))
        } else {
            None
        };
        if let Some(output) = refused {
            return self.settle_spawn(id, visit, branch, false, output);
        }
        let base = match &spawn.base {
            None => self.state.repo.base_commit.clone(),
            Some(e) => match expr::eval(e, &ctx).map_err(&err)? {
                // Only a commit this run knows: its base, one of its own steps', a child's head
                // or a sibling's event; never a hash picked out of thin air.
                Value::String(c) if self.state.knows_commit(&c) => c,
                Value::Null => self.state.repo.base_commit.clone(),
                other => {
                    let output = refusal("bad_base", json!({"base": other}));
                    return self.settle_spawn(id, visit, branch, false, output);
                }
            },
        };
        let schema = self.input_schema();
        let mut inputs = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let input = match &spawn.input {
                None => item.clone(),
                Some(e) => {
                    ctx["item"] = item.clone();
                    ctx["index"] = json!(index);
                    expr::eval(e, &ctx).map_err(&err)?
                }
            };
            if let Some(schema) = &schema {
                if let Err(why) = crate::schema::validate(schema, &input) {
                    let output = refusal(
                        "child_input_invalid",
                        json!({"index": index, "error": why.replace("output breaks", "input breaks")}),
                    );
                    return self.settle_spawn(id, visit, branch, false, output);
                }
            }
            inputs.push(input);
        }
        if items.is_empty() {
            let output = json!({"children": [], "count": 0, "succeeded": 0, "failed": 0,
                                "cancelled": 0});
            return self.settle_spawn(id, visit, branch, true, output);
        }
        let n = items.len() as u32;
        let share = (budget - n) / n;
        self.state.spawn_budget = Some(budget - n - share * n);
        let records = items
            .into_iter()
            .zip(inputs)
            .enumerate()
            .map(|(index, (item, input))| ChildRecord {
                run_id: child_run_id(&self.state.run_id, id, visit, index),
                item,
                input,
                status: None,
                result: Value::Null,
                head: None,
                share,
            })
            .collect();
        let group = ChildGroup {
            node: id.clone(),
            visit,
            branch,
            base,
            first_failure: spawn.wait == crate::graph::SpawnWait::FirstFailure,
            settled: false,
            relayed: Default::default(),
            children: records,
        };
        let children = (0..group.children.len())
            .map(|i| self.state.child_run(&group, i))
            .collect();
        self.state
            .children
            .insert(ChildGroup::key(id, visit), group);
        self.fx.push(super::Effect::StartChildren(children));
        Ok(())
    }

    /// A child ended: record it, take back its unused budget and packs, and settle the group
    /// when every child ended (or, for `first_failure`, one did not succeed).
    pub(super) fn child_finished(&mut self, report: &ChildReport) -> Result<(), EngineError> {
        let key = ChildGroup::key(&report.node, report.visit);
        let budget = self
            .state
            .spawn_budget(self.bundle.graph.defaults.tree.max_runs);
        for pack in &report.packs {
            if !self.state.repo.packs.contains(pack) {
                self.state.repo.packs.push(pack.clone());
            }
        }
        let Some(group) = self.state.children.get_mut(&key) else {
            return Ok(());
        };
        let Some(record) = group
            .children
            .get_mut(report.index as usize)
            .filter(|c| c.run_id == report.child && c.status.is_none())
        else {
            return Ok(());
        };
        record.status = Some(report.status);
        record.result = report.result.clone();
        record.head = report.head.clone();
        let returned = report.budget_left.min(record.share);
        self.state.spawn_budget = Some(budget.saturating_add(returned));
        let Some(group) = self.state.children.get_mut(&key) else {
            return Ok(());
        };
        if group.settled {
            return Ok(());
        }
        let failed = report.status != RunStatus::Succeeded;
        let all_ended = group.running().next().is_none();
        if !(all_ended || (group.first_failure && failed)) {
            return Ok(());
        }
        group.settled = true;
        let group = group.clone();
        let stop: Vec<RunId> = group.running().map(|c| c.run_id.clone()).collect();
        let still_running = stop.len();
        if !stop.is_empty() {
            self.fx.push(super::Effect::CancelRuns(stop));
        }
        let count = |s: RunStatus| {
            group
                .children
                .iter()
                .filter(|c| c.status == Some(s))
                .count()
        };
        let succeeded = count(RunStatus::Succeeded);
        let output = json!({
            "children": group.children.iter().enumerate().map(|(i, c)| json!({
                "index": i, "run_id": c.run_id, "item": c.item, "status": c.status,
                "result": c.result, "head": c.head,
            })).collect::<Vec<_>>(),
            "count": group.children.len(),
            "succeeded": succeeded,
            "failed": count(RunStatus::Failed),
            "cancelled": count(RunStatus::Cancelled),
            "running": still_running,
        });
        let ok = succeeded == group.children.len();
        self.settle_spawn(&group.node, group.visit, group.branch, ok, output)
    }

    /// Records the spawn node's outcome and routes on.
    fn settle_spawn(
        &mut self,
        id: &NodeId,
        visit: u32,
        branch: Option<u32>,
        ok: bool,
        output: Value,
    ) -> Result<(), EngineError> {
        let outcome =
            Outcome::of_engine(&self.state.run_id, id, visit, ok, output, self.at, branch);
        self.state.history.push(outcome);
        let n = self.node(id)?.clone();
        for t in self.route(&n, id, branch)? {
            if self.state.status.is_terminal() {
                break;
            }
            self.enter(&t, branch, Some(id))?;
        }
        Ok(())
    }

    /// Children still running when the run ends: their groups are settled and they are
    /// cancelled (the cascade).
    pub(super) fn orphans(&mut self) -> Vec<RunId> {
        let mut stop = Vec::new();
        for group in self.state.children.values_mut().filter(|g| !g.settled) {
            group.settled = true;
            stop.extend(group.running().map(|c| c.run_id.clone()));
        }
        stop
    }

    fn input_schema(&self) -> Option<Value> {
        let path = self.bundle.graph.input_schema.as_ref()?;
        serde_json::from_str(self.bundle.file(path)?).ok()
    }
}
