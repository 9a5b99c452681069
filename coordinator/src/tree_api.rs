//! The route of a run's tree of child runs (`GET /v1/runs/:id/tree`), served through
//! `crate::api::routes` and documented in the OpenAPI document like the others.

use crate::api::{at, ApiError, Route, Verb};
use crate::driver::{Coordinator, DriverError};
use crate::openapi::{NoSuchRun, RunPath};
use axum::extract::{Path, State};
use axum::Json;
use shared::engine::RunState;
use shared::http::{ChildView, RunTree, TreeView};
use shared::ids::RunId;
use std::collections::HashMap;
use std::sync::Arc;

pub fn routes() -> Vec<Route> {
    vec![at(Verb::Get, "/v1/runs/:id/tree", run_tree)]
}

/// The run and every run below it, nested; children not (or no longer) in the store are
/// listed as missing. At most the tree's largest allowed size is read.
#[utoipa::path(
    get, path = "/v1/runs/{id}/tree",
    params(RunPath),
    responses((status = 200, body = RunTree), NoSuchRun)
)]
pub(crate) async fn run_tree(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
) -> Result<Json<RunTree>, ApiError> {
    let root = c.load(&RunId::new(id)).await?;
    let mut loaded: HashMap<RunId, RunState> = HashMap::new();
    let mut queue: Vec<RunId> = ChildView::all(&root)
        .into_iter()
        .map(|v| v.run_id)
        .collect();
    while let Some(run) = queue.pop() {
        if loaded.len() >= shared::limits::MAX_TREE_RUNS as usize || loaded.contains_key(&run) {
            continue;
        }
        match c.load(&run).await {
            // Only the root's team's runs: a tree never shows another team's run.
            Ok(state) if state.team != root.team => {}
            Ok(state) => {
                queue.extend(ChildView::all(&state).into_iter().map(|v| v.run_id));
                loaded.insert(run, state);
            }
            Err(DriverError::UnknownRun(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let tree = TreeView::build(&root, &mut |id| loaded.remove(id));
    Ok(Json(RunTree {
        v: shared::http::API_VERSION,
        tree,
    }))
}
