//! Bounds on what a submission may ask for, in one place: a graph, its expressions, budgets and
//! timeouts are checked against these before anything runs (a 20,000-node graph is refused in
//! milliseconds rather than analysed for minutes), and the engine holds a fan-out to its width.
//!
//! Limits a process sets at run time, with their configuration (README, "Configuration"):
//! the HTTP body (2 MB, `coordinator::api`), a job folder's disk (`FLEET_JOB_DISK_MB`, 2 GiB,
//! `worker::runner`), container memory, CPU, pids and tmpfs sizes (`worker::sandbox::Limits`),
//! context files and reports read from a worktree (`worker::safe_fs`), job folders and finished
//! runs by age (`FLEET_JOB_DIR_MAX_AGE_SECONDS`, `FLEET_RUN_RETENTION_SECONDS`).

/// Nodes in one graph.
pub const MAX_NODES: usize = 500;
/// Route targets, wait-for entries and observed nodes, summed over the graph.
pub const MAX_EDGES: usize = 5_000;
/// Bytes of one expression or template in the graph file.
pub const MAX_EXPRESSION_BYTES: usize = 16 * 1024;
/// A node's visit budget.
pub const MAX_VISITS: u32 = 10_000;
/// A job's timeout: one week.
pub const MAX_TIMEOUT_SECONDS: u64 = 7 * 24 * 3600;
/// Branches one fan-out may start.
pub const MAX_FANOUT: usize = 100_000;
/// How deep a tree of child runs may go (`defaults.tree.max_depth`; the root is depth 0)
/// and how many runs it may hold (`defaults.tree.max_runs`, the root included).
pub const MAX_TREE_DEPTH: u32 = 8;
pub const MAX_TREE_RUNS: u32 = 1_000;
/// An agent's turns and output tokens per call.
pub const MAX_TURNS: u32 = 1_000;
pub const MAX_TOKENS: u32 = 1_000_000;
/// Invocations of one incremental agent session in one job (seed 003).
pub const MAX_INVOCATIONS: u32 = 200;
/// A command agent's budget per run: calls through the gateways and tokens over them.
pub const MAX_COMMAND_CALLS: u32 = 10_000;
pub const MAX_COMMAND_TOKENS: u64 = 100_000_000;
/// Instructions one template render or one expression evaluation may execute (minijinja's
/// fuel; most instructions cost 1): a prompt looping over 1,000 items at 100 instructions each
/// uses a tenth of it, while two nested `range(100000)` loops run out after about 30 ms
/// (release build) instead of running for hours.
pub const TEMPLATE_FUEL: u64 = 1_000_000;
/// Bytes one template render may emit, into its output and into captured blocks together:
/// 1 MiB, five times the 200 KiB of context files a prompt may carry.
pub const MAX_RENDERED_BYTES: usize = 1024 * 1024;
/// Bytes of the values one render may bind (`set`, `with`, the items of `for` loops, each
/// value measured deep, summed over the render) and the size of an expression's value: a
/// string doubled by `{% set s = s ~ s %}` is refused once it passes this, long before it
/// exhausts memory.
pub const MAX_TEMPLATE_VALUE_BYTES: usize = 64 * 1024 * 1024;
/// Items one `for` loop of a template may iterate over (and `flatten` or `difference` take):
/// minijinja's own cap on `range()` (its documentation says 10,000; the code allows 100,000).
pub const MAX_LOOP_ITEMS: usize = 100_000;

use crate::graph::Graph;

/// The first limit the graph exceeds, as a message naming the limit.
pub fn graph_exceeds(g: &Graph) -> Option<String> {
    if g.nodes.len() > MAX_NODES {
        return Some(format!(
            "the graph has {} nodes; at most {MAX_NODES} are allowed",
            g.nodes.len()
        ));
    }
    let edges: usize = g
        .nodes
        .values()
        .map(|n| {
            n.routes.iter().map(|r| r.to.nodes().len()).sum::<usize>()
                + n.wait_for().len()
                + n.observes.len()
        })
        .sum();
    if edges > MAX_EDGES {
        return Some(format!(
            "the graph has {edges} edges; at most {MAX_EDGES} are allowed"
        ));
    }
    if g.defaults.timeout_seconds > MAX_TIMEOUT_SECONDS {
        return Some(format!(
            "defaults.timeout_seconds is {}; at most {MAX_TIMEOUT_SECONDS} is allowed",
            g.defaults.timeout_seconds
        ));
    }
    let tree = g.defaults.tree;
    if !(1..=MAX_TREE_DEPTH).contains(&tree.max_depth) {
        return Some(format!(
            "defaults.tree.max_depth is {}; it must be 1 to {MAX_TREE_DEPTH}",
            tree.max_depth
        ));
    }
    if !(2..=MAX_TREE_RUNS).contains(&tree.max_runs) {
        return Some(format!(
            "defaults.tree.max_runs is {}; it must be 2 to {MAX_TREE_RUNS} (the root counts)",
            tree.max_runs
        ));
    }
    for (id, n) in &g.nodes {
        if n.max_visits.is_some_and(|v| v > MAX_VISITS) {
            return Some(format!("node `{id}`: max_visits is above {MAX_VISITS}"));
        }
        if n.timeout_seconds.is_some_and(|t| t > MAX_TIMEOUT_SECONDS)
            || n.agent()
                .and_then(|a| a.nudge_after_seconds)
                .is_some_and(|t| t > MAX_TIMEOUT_SECONDS)
        {
            return Some(format!(
                "node `{id}`: a timeout above {MAX_TIMEOUT_SECONDS} s"
            ));
        }
        let long = n
            .with
            .values()
            .chain(n.derive.values())
            .chain(n.routes.iter().filter_map(|r| r.when.as_ref()))
            .chain(n.commands().iter())
            .any(|e| e.len() > MAX_EXPRESSION_BYTES);
        if long {
            return Some(format!(
                "node `{id}`: an expression longer than {MAX_EXPRESSION_BYTES} bytes"
            ));
        }
    }
    None
}
