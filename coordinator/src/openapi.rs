//! The API's OpenAPI document, generated from the handlers' `#[utoipa::path]` attributes and the
//! body types (`shared::http`, `SubmitRequest`, batches', schedules'), served at
//! `GET /v1/openapi.json`.

use crate::api;
use shared::http;
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::RefOr;
use utoipa::{IntoParams, IntoResponses, Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "fleet coordinator",
        description = "Runs of agent graphs: submit, watch, approve, cancel, read results and \
            artifacts. Every JSON body names the API version it speaks (`v`); any route may also \
            answer 500 with an `ErrorBody`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    paths(
        crate::health::healthz,
        crate::health::metrics,
        api::openapi,
        api::create_run,
        api::list_runs,
        api::run_status,
        api::run_summary,
        crate::result_wait::run_result,
        api::cancel_run,
        crate::decisions_api::decide_approval,
        api::run_logs,
        api::list_artifacts,
        api::get_run_artifact,
        api::get_artifact,
        crate::tree_api::run_tree,
        crate::decisions_api::list,
        crate::decisions_api::decide,
        crate::tracking_api::events,
        crate::tracking_api::costs,
        crate::tracking_api::run_dashboard,
        crate::tracking_api::deliveries,
        crate::tracking_api::set_budget,
        crate::auth_api::create_token,
        crate::auth_api::list_tokens,
        crate::auth_api::revoke_token,
        crate::uploads::upload_pack,
        crate::uploads::uploaded_commit,
        crate::team_api::show,
        crate::team_api::set_limits,
        crate::team_api::set_webhook,
        crate::team_api::webhook_secret,
        crate::team_api::events,
        crate::team_api::deliveries,
        crate::web::page,
        crate::web::graph,
        crate::web::watch,
        crate::batches::api::create_batch,
        crate::batches::api::list_batches,
        crate::batches::api::batch_status,
        crate::batches::api::batch_summary,
        crate::batches::api::cancel_batch,
        crate::batches::api::batch_report,
        crate::batches::api::batch_junit,
        crate::batches::api::rerun_batch,
        crate::batches::api::compare_batches,
        crate::batches::api::batch_html,
        crate::schedules::api::create_schedule,
        crate::schedules::api::list_schedules,
        crate::schedules::api::show_schedule,
        crate::schedules::api::run_schedule,
        crate::schedules::api::delete_schedule,
        crate::schedules::api::schedule_report,
    ),
    components(schemas(
        http::ErrorBody,
        http::Submitted,
        http::RunListing,
        http::RunSummary,
        http::StatusView,
        http::RunTree,
        http::TreeView,
        shared::engine::TreeLink,
        http::ChildView,
        http::RunOutcome,
        http::CancelAnswer,
        http::Decided,
        http::QuarantineView,
        http::QuarantineItem,
        http::QuarantineDecided,
        crate::decisions_api::QuarantineBody,
        crate::tracking_api::BudgetBody,
        crate::auth_api::NewToken,
        crate::auth_api::TokenView,
        crate::auth_api::TokenCreated,
        http::Uploaded,
        http::RepoUpload,
        shared::quota::TeamLimits,
        shared::quota::TeamView,
        shared::quota::Rate,
        shared::quota::Spent,
        shared::quota::QuotaScope,
        shared::quota::QuotaNotice,
        crate::team_api::WebhookBody,
        http::GraphView,
        http::NodeView,
        http::EdgeView,
        http::NodeState,
        shared::auth::Role,
        shared::tracking::EventType,
        shared::tracking::RunBudget,
        shared::tracking::budget::BudgetMark,
        shared::tracking::budget::BudgetMarkKind,
        shared::tracking::dashboard::Dashboard,
        shared::tracking::costs::CostReport,
        shared::engine::Decision,
        http::LogEntry,
        http::ArtifactListing,
        crate::submit::SubmitRequest,
        crate::batches::BatchRequest,
        crate::batches::BatchSubmitted,
        crate::batches::api::BatchView,
        crate::batches::api::BatchSummary,
        crate::batches::api::BatchListing,
        crate::batches::api::RerunBody,
        crate::batches::api::RerunWhich,
        crate::schedules::ScheduleRequest,
        crate::schedules::WebhookRequest,
        crate::schedules::ScheduleAdded,
        crate::schedules::Fired,
        crate::schedules::api::ScheduleListing,
        crate::schedules::api::ScheduleView,
        crate::schedules::api::WebhookView,
        crate::schedules::api::Removed,
        shared::schedule::Firing,
        shared::schedule::FiringKind,
        shared::schedule::FiringStage,
        shared::schedule::Delivery,
        shared::schedule::DeliveryAttempt,
        shared::schedule::DeliveryState,
    )),
    modifiers(&ChosenRunId, &BearerTokens)
)]
struct ApiDoc;

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The path parameter of the routes below `/v1/runs/{id}`.
#[derive(IntoParams)]
#[into_params(names("id"), parameter_in = Path)]
pub struct RunPath(
    /// The run's id.
    pub String,
);

/// No such run.
#[derive(IntoResponses)]
#[response(status = 404)]
pub struct NoSuchRun(pub http::ErrorBody);

/// The submission's `run_id`: the API takes it off the body before the rest is read as a
/// `SubmitRequest` (which refuses unknown fields), so the derived schema lacks it.
struct ChosenRunId;

impl Modify for ChosenRunId {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let Some(components) = doc.components.as_mut() else {
            return;
        };
        if let Some(RefOr::T(Schema::Object(submit))) = components.schemas.get_mut("SubmitRequest")
        {
            let run_id = ObjectBuilder::new()
                .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
                .description(Some(
                    "an id the submitter chooses instead of the derived one",
                ))
                .build();
            submit.properties.insert("run_id".into(), run_id.into());
        }
    }
}

/// A route's path as OpenAPI writes it: `:id` and `*key` become `{id}` and `{key}`.
fn templated(path: &str) -> String {
    path.split('/')
        .map(|seg| match seg.strip_prefix([':', '*']) {
            Some(name) => format!("{{{name}}}"),
            None => seg.to_string(),
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The API's tokens (`Authorization: Bearer fleet_…`): the security scheme, required by every
/// operation but the public routes', from the route table itself.
struct BearerTokens;

impl Modify for BearerTokens {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{
            Http, HttpAuthScheme, SecurityRequirement, SecurityScheme,
        };
        if let Some(components) = doc.components.as_mut() {
            let mut http = Http::new(HttpAuthScheme::Bearer);
            http.description = Some(
                "an API token (`fleet token`); a team's token sees only its team's runs, batches, \
                 schedules and artifacts"
                    .into(),
            );
            components.add_security_scheme("token", SecurityScheme::Http(http));
        }
        for route in api::routes() {
            if route.access == shared::auth::Access::Public {
                continue;
            }
            let Some(item) = doc.paths.paths.get_mut(&templated(route.path)) else {
                continue;
            };
            let op = match route.verb {
                api::Verb::Get => item.get.as_mut(),
                api::Verb::Post => item.post.as_mut(),
            };
            if let Some(op) = op {
                op.security = Some(vec![SecurityRequirement::new(
                    "token",
                    Vec::<String>::new(),
                )]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::collections::BTreeSet;

    fn json() -> Value {
        serde_json::to_value(document()).expect("the document serializes")
    }

    const METHODS: [&str; 8] = [
        "get", "put", "post", "delete", "options", "head", "patch", "trace",
    ];

    /// Client generators refuse a document whose operation ids repeat (OpenAPI 3.1: "the id
    /// MUST be unique among all operations described in the API").
    #[test]
    fn every_operation_id_is_unique() {
        let doc = json();
        let mut seen = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for m in METHODS {
                if let Some(id) = item[m]["operationId"].as_str() {
                    assert!(
                        seen.insert(id.to_string()),
                        "{m} {path}: `{id}` is used twice"
                    );
                }
            }
        }
        assert!(seen.len() > 40, "{seen:?}");
    }

    #[test]
    fn every_route_but_the_public_ones_asks_for_a_token() {
        let doc = json();
        assert_eq!(
            doc["components"]["securitySchemes"]["token"]["scheme"],
            "bearer"
        );
        for r in api::routes() {
            let op = &doc["paths"][templated(r.path)][r.verb.as_str()];
            let secured = op["security"] == serde_json::json!([{"token": []}]);
            let public = r.access == shared::auth::Access::Public;
            assert_eq!(secured, !public, "{} {}: {op}", r.verb.as_str(), r.path);
        }
    }

    #[test]
    fn the_document_lists_every_route_the_router_serves_and_no_other() {
        let served: BTreeSet<(String, String)> = api::routes()
            .iter()
            .map(|r| (r.verb.as_str().to_string(), templated(r.path)))
            .collect();
        assert_eq!(served.len(), api::routes().len(), "a route is listed twice");
        let doc = json();
        let mut documented = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in METHODS.iter().filter(|m| item.get(**m).is_some()) {
                documented.insert((method.to_string(), path.clone()));
            }
        }
        assert_eq!(documented, served);
        // Each templated segment is a documented path parameter of its operation.
        for (method, path) in &served {
            let op = &doc["paths"][path][method];
            let params: BTreeSet<&str> = op["parameters"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .filter(|p| p["in"] == "path")
                        .filter_map(|p| p["name"].as_str())
                        .collect()
                })
                .unwrap_or_default();
            let wanted: BTreeSet<&str> = path
                .split('/')
                .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
                .collect();
            assert_eq!(params, wanted, "{method} {path}");
            assert!(
                op["responses"].as_object().is_some_and(|r| !r.is_empty()),
                "{method} {path} documents no response"
            );
        }
    }

    #[test]
    fn every_body_schema_is_present_and_every_reference_resolves() {
        let doc = json();
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        for body in [
            "ErrorBody",
            "Submitted",
            "SubmitRequest",
            "RunListing",
            "RunSummary",
            "StatusView",
            "RunOutcome",
            "CancelAnswer",
            "Decided",
            "DecideBody",
            "QuarantineView",
            "QuarantineDecided",
            "QuarantineBody",
            "LogEntry",
            "ArtifactListing",
            // Types inside the bodies.
            "RunId",
            "JobId",
            "NodeId",
            "RunStatus",
            "JobStatus",
            "JobState",
            "Usage",
            "ApprovalState",
            "AgentConfig",
            "ScheduleRequest",
            "WebhookRequest",
            "ScheduleView",
            "Firing",
            "DeliveryAttempt",
        ] {
            assert!(schemas.contains_key(body), "no schema `{body}`");
        }
        fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
            match v {
                Value::Object(o) => {
                    if let Some(Value::String(r)) = o.get("$ref") {
                        out.push(r);
                    }
                    o.values().for_each(|v| refs(v, out));
                }
                Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
                _ => {}
            }
        }
        let mut found = Vec::new();
        refs(&doc, &mut found);
        assert!(!found.is_empty());
        for r in found {
            let name = r
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("a reference outside the schemas: {r}"));
            assert!(schemas.contains_key(name), "`{r}` names no schema");
        }
    }

    /// Through JSON text and back, the document is the same. (Not through utoipa's own types:
    /// a schema without a `type`, the one of a `serde_json::Value` field, does not read back into
    /// them — utoipa issue #1192 — though it is valid OpenAPI.)
    #[test]
    fn the_document_round_trips_as_json() {
        let text = document()
            .to_pretty_json()
            .expect("the document serializes");
        let read: Value = serde_json::from_str(&text).expect("it is JSON");
        assert_eq!(read, json());
        let again: Value = serde_json::from_str(&read.to_string()).unwrap();
        assert_eq!(again, read);
        assert!(read["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1")));
        assert_eq!(read["info"]["version"], env!("CARGO_PKG_VERSION"));
    }

    #[tokio::test]
    async fn the_route_serves_the_document() {
        let axum::Json(served) = api::openapi().await;
        assert!(served == document());
    }

    #[test]
    fn the_submission_schema_has_the_request_fields_and_the_chosen_run_id() {
        let doc = json();
        let submit = &doc["components"]["schemas"]["SubmitRequest"];
        let props: BTreeSet<&str> = submit["properties"]
            .as_object()
            .expect("properties")
            .keys()
            .map(String::as_str)
            .collect();
        let wanted = BTreeSet::from([
            "graph",
            "input",
            "repo",
            "git_ref",
            "agent",
            "run_id",
            "budget_usd",
            "webhook",
            "upload",
        ]);
        assert_eq!(props, wanted);
        let required: BTreeSet<&str> = submit["required"]
            .as_array()
            .expect("required")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(!required.contains("run_id"));
        // The repository comes as a path or as an upload: neither is required alone.
        assert!(required.contains("graph") && !required.contains("repo"));
    }
}
