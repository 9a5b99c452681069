//! The node's step, by kind: an agent (prompt with its context files, the built-in loop, claims
//! checked against disk), commands, a harness op (patch, verification, tests, build, mutants,
//! skeleton) or a git step. What it returns is the job's outcome and usage.

use super::preflight::{preflight, Preflight};
use super::{RunError, Runner};
use crate::agent::command::CommandJob;
use crate::agent::gateway::Gateway;
use crate::agent::{self, AgentJob};
use crate::browser::Evidence;
use crate::git::Worktree;
use crate::harness::{self, Artifacts, StepOutcome};
use crate::sandbox::Session;
use crate::tools::{Journal, ToolBox};
use crate::{hardened, mutation, verify};
use serde_json::{json, Value};
use shared::factory::{MAX_CONTEXT_BYTES, MAX_CONTEXT_FILES};
use shared::features::events::{claims_events, gates_events, settle_events};
use shared::graph::{GraphBundle, HarnessOp, NodeBody};
use shared::messages::{AgentConfig, JobSpec, JobStatus, Usage};
use shared::paths::normalize_relative;
use std::path::Path;
use std::time::Duration;

/// Where a step runs: its worktree, its container, and a command agent's gateway.
pub(super) struct Place<'a> {
    pub wt: Option<&'a Worktree>,
    pub session: Option<&'a dyn Session>,
    pub gateway: Option<Gateway>,
}

impl Runner {
    pub(super) async fn step(
        &self,
        dir: &Path,
        spec: &JobSpec,
        bundle: &GraphBundle,
        place: Place<'_>,
        art: &mut Artifacts<'_>,
    ) -> Result<(StepOutcome, Usage), RunError> {
        let Place {
            wt,
            session,
            gateway,
        } = place;
        let node = bundle.graph.node(&spec.node).expect("checked by execute");
        let timeout = Duration::from_secs(spec.timeout_seconds);
        let harness_dir = dir.join("harness");
        let seed = format!("{}:{}", spec.job_id, spec.attempt);
        let no_worktree = || RunError::Permanent(format!("node `{}` needs a worktree", spec.node));
        if node.kind() != spec.kind {
            return Err(RunError::Permanent(format!(
                "the job names node `{}` as a {:?} node; the graph has a {:?} node",
                spec.node,
                spec.kind,
                node.kind()
            )));
        }
        match &node.body {
            NodeBody::Agent(agent_node) => {
                let session = session.expect("agents run in a container");
                let template_path = agent_node.template.as_str();
                let schema_path = agent_node.output_schema.as_str();
                let schema: Value = serde_json::from_str(bundle.file(schema_path).unwrap_or("{}"))
                    .map_err(|e| {
                        RunError::Permanent(format!(
                            "the output schema `{schema_path}` is not json: {e}"
                        ))
                    })?;
                let mut ctx = spec.vars.clone();
                ctx["params"] = spec.params.clone();
                ctx["context_files"] = match wt {
                    Some(wt) => {
                        let files = spec.context_files.clone();
                        wt.blocking(move |wt| read_context(&wt.dir, &files)).await
                    }
                    None => json!([]),
                };
                let prompt = match shared::expr::render(
                    template_path,
                    bundle.file(template_path).unwrap_or_default(),
                    &ctx,
                ) {
                    Ok(p) => p,
                    Err(e) => {
                        let step = StepOutcome {
                            status: JobStatus::Error,
                            output: Value::Null,
                            error: Some(e.to_string()),
                        };
                        return Ok((step, Usage::default()));
                    }
                };
                art.put("prompt.md", prompt.clone().into_bytes()).await?;
                let prior = match &spec.continues {
                    Some(key) => Some(self.blobs.get_json::<Value>(key).await?),
                    None => None,
                };
                let journal = Journal::default();
                let spec_text = [&spec.params["spec"], &spec.vars["input"]["spec"]]
                    .into_iter()
                    .find_map(Value::as_str)
                    .unwrap_or(&prompt);
                let allowed = match preflight(agent_node, spec_text, session, &journal)
                    .await
                    .map_err(RunError::Transient)?
                {
                    Preflight::Ready(tools) => tools,
                    Preflight::Missing(why) => {
                        art.events.extend(journal.take());
                        let step = StepOutcome {
                            status: JobStatus::Error,
                            output: Value::Null,
                            error: Some(why),
                        };
                        return Ok((step, Usage::default()));
                    }
                };
                let retry = agent_node
                    .tool_policy
                    .as_ref()
                    .and_then(|p| p.retry.as_ref());
                if let Some(plan) = &spec.incremental {
                    let wt = wt.ok_or_else(no_worktree)?;
                    if matches!(spec.agent, AgentConfig::Command(_)) {
                        return Err(RunError::Permanent(
                            "an incremental session runs the built-in loop or a script, not a command agent".into(),
                        ));
                    }
                    let sessions = super::incremental::Sessions {
                        spec,
                        plan,
                        tools: &allowed,
                        journal: &journal,
                        retry,
                        prompt,
                        schema: &schema,
                        session,
                        wt,
                        timeout,
                    };
                    let out = self.incremental(sessions, prior, art).await;
                    art.events.extend(journal.take());
                    let mut out = out?;
                    super::evidence::check(agent_node, &mut out, &art.written);
                    return self.agent_done(agent_node, spec, wt, out, art).await;
                }
                if let Some(failed) = super::verifier::setup(agent_node, session, art).await? {
                    return Ok((failed, Usage::default()));
                }
                let agent_config =
                    super::verifier::agent_config(agent_node, spec).map_err(RunError::Permanent)?;
                let evidence = Evidence::new(art);
                let job = AgentJob {
                    node: spec.node.as_str(),
                    visit: spec.visit,
                    params: &spec.params,
                    nudge_after: spec.nudge_after_seconds.map(Duration::from_secs),
                    prompt,
                    schema: &schema,
                    tools: ToolBox {
                        session,
                        allowed: &allowed,
                        command_timeout: Duration::from_secs(120).min(timeout),
                        evidence: Some(&evidence),
                        journal: &journal,
                        retry,
                    },
                    inbox: None,
                    invocation: None,
                    usd_left: spec.llm_usd_left,
                };
                let out = match (&agent_config, gateway) {
                    (AgentConfig::Command(agent), Some(gateway)) => {
                        let socket = session
                            .mounts()
                            .gateway
                            .map(|d| format!("{d}/{}", agent::gateway::SOCKET_NAME))
                            .unwrap_or_default();
                        let command = CommandJob {
                            job,
                            agent,
                            socket,
                            session_id: format!("{}.{}", spec.run_id, spec.node),
                            timeout,
                        };
                        agent::command::run(command, gateway).await
                    }
                    _ => {
                        let llm = self
                            .config
                            .llm
                            .for_job(spec.run_id.as_str(), spec.team.as_deref());
                        agent::run(job, &agent_config, &llm, &self.http, prior).await
                    }
                };
                evidence.flush(art).await?;
                art.events.extend(journal.take());
                let mut out = out;
                super::evidence::check(agent_node, &mut out, &art.written);
                super::verifier::check(agent_node, spec, &mut out, &art.written);
                match wt {
                    Some(wt) => self.agent_done(agent_node, spec, wt, out, art).await,
                    None => agent_output(out, art).await,
                }
            }
            NodeBody::Command { .. } => {
                let session = session.expect("commands run in a container");
                Ok((
                    harness::commands(&spec.commands, timeout, session, art).await?,
                    Usage::default(),
                ))
            }
            NodeBody::Harness { op } => {
                let step = match op {
                    HarnessOp::ApplyPatch => {
                        harness::apply_patch(
                            &spec.params,
                            spec.write_scope.as_ref(),
                            wt.ok_or_else(no_worktree)?,
                            art,
                        )
                        .await?
                    }
                    HarnessOp::FactoryVerify => {
                        let place = verify::RunPlace {
                            session: session.expect("verification runs in a container"),
                            wt: wt.ok_or_else(no_worktree)?,
                            harness_dir: &harness_dir,
                        };
                        harness::factory_verify(&spec.params, &place, &seed, art).await?
                    }
                    HarnessOp::RunTests => {
                        let place = verify::RunPlace {
                            session: session.expect("tests run in a container"),
                            wt: wt.ok_or_else(no_worktree)?,
                            harness_dir: &harness_dir,
                        };
                        verify::run_tests(&spec.params, &place, &seed, art).await?
                    }
                    HarnessOp::CheckBuild => {
                        let session = session.expect("the build runs in a container");
                        let root = wt.ok_or_else(no_worktree)?.dir.clone();
                        verify::check_build(&spec.params, &root, session, art).await?
                    }
                    HarnessOp::GenerateMutants => {
                        let params = spec.params.clone();
                        let step = wt
                            .ok_or_else(no_worktree)?
                            .blocking(move |wt| mutation::generate(&params, &wt.dir))
                            .await;
                        art.put_json("mutants.json", &step.output).await?;
                        step
                    }
                    HarnessOp::RunMutants => {
                        let place = verify::RunPlace {
                            session: session.expect("mutants run in a container"),
                            wt: wt.ok_or_else(no_worktree)?,
                            harness_dir: &harness_dir,
                        };
                        mutation::run(&spec.params, &place, &seed, art).await?
                    }
                    HarnessOp::TallyMutants => {
                        let step = mutation::tally(&spec.params);
                        art.put_json("mutation_tally.json", &step.output).await?;
                        step
                    }
                    HarnessOp::CheckSkeleton => {
                        let session = session.expect("the build runs in a container");
                        crate::skeleton_check::check_skeleton(
                            &spec.params,
                            wt.ok_or_else(no_worktree)?,
                            session,
                            art,
                        )
                        .await?
                    }
                    HarnessOp::RenderFiles => {
                        let (params, bundle) = (spec.params.clone(), bundle.clone());
                        wt.ok_or_else(no_worktree)?
                            .blocking(move |wt| {
                                crate::render::render_files(&params, &bundle, &wt.dir)
                            })
                            .await
                    }
                    HarnessOp::CheckMechanical => {
                        let params = spec.params.clone();
                        let step = wt
                            .ok_or_else(no_worktree)?
                            .blocking(move |wt| harness::check_mechanical(&params, wt))
                            .await?;
                        art.put_json("mechanical.json", &step.output).await?;
                        step
                    }
                    HarnessOp::Noop => StepOutcome {
                        status: JobStatus::Ok,
                        output: json!({}),
                        error: None,
                    },
                    HarnessOp::Collect => StepOutcome {
                        status: JobStatus::Ok,
                        output: spec.params.clone(),
                        error: None,
                    },
                    HarnessOp::ReviewFeatures
                    | HarnessOp::ExtractClaims
                    | HarnessOp::SettleClaims => {
                        let (params, op) = (spec.params.clone(), *op);
                        let step = wt
                            .ok_or_else(no_worktree)?
                            .blocking(move |wt| match op {
                                HarnessOp::ReviewFeatures => {
                                    hardened::review_features(&params, &wt.dir)
                                }
                                HarnessOp::ExtractClaims => {
                                    hardened::extract_claims(&params, &wt.dir)
                                }
                                _ => hardened::settle_claims(&params, &wt.dir),
                            })
                            .await;
                        art.put_json(&format!("{}.json", op.name()), &step.output)
                            .await?;
                        let now = chrono::Utc::now();
                        art.events.extend(match op {
                            HarnessOp::ExtractClaims => claims_events(&step.output, now),
                            HarnessOp::SettleClaims => settle_events(&step.output, now),
                            _ => Vec::new(),
                        });
                        step
                    }
                    HarnessOp::RunGates => {
                        let session = session.expect("gates run in a container");
                        let step = hardened::run_gates(&spec.params, session, art).await?;
                        art.events
                            .extend(gates_events(&step.output, chrono::Utc::now()));
                        step
                    }
                };
                Ok((step, Usage::default()))
            }
            NodeBody::Git { op } => {
                let wt = wt.ok_or_else(no_worktree)?;
                let (op, job) = (*op, spec.clone());
                let step = wt
                    .blocking(move |wt| harness::git_step(op, &job.params, &job, wt))
                    .await?;
                art.put_json("git_result.json", &step.output).await?;
                Ok((step, Usage::default()))
            }
            NodeBody::Exit { .. }
            | NodeBody::Join { .. }
            | NodeBody::Fanout { .. }
            | NodeBody::Spawn(_)
            | NodeBody::Approval { .. } => Ok((
                StepOutcome {
                    status: JobStatus::Error,
                    output: Value::Null,
                    error: Some(format!("{:?} nodes are not jobs", spec.kind).to_lowercase()),
                },
                Usage::default(),
            )),
        }
    }
}

/// The prompt's context files, read by the harness: at most 10 files and 200 KB in all, cut
/// deterministically; paths that escape the worktree are refused.
fn read_context(root: &Path, files: &[String]) -> Value {
    let mut budget = MAX_CONTEXT_BYTES;
    let mut out = Vec::new();
    for f in files.iter().take(MAX_CONTEXT_FILES) {
        let Ok(rel) = normalize_relative(f) else {
            out.push(json!({"path": f, "content": "[refused: path escapes the worktree]", "truncated": false}));
            continue;
        };
        // Never through a link (a repo's `ctx.md -> /proc/self/environ` must not reach a prompt),
        // never more than the budget left.
        match crate::safe_fs::read_capped(root, &rel, budget) {
            Ok(read) => {
                budget -= read.bytes.len();
                out.push(json!({
                    "path": rel,
                    "content": String::from_utf8_lossy(&read.bytes),
                    "truncated": read.truncated,
                }));
            }
            Err(e) => out.push(json!({
                "path": rel,
                "content": format!("[refused: {e}]"),
                "truncated": false,
            })),
        }
    }
    Value::Array(out)
}

/// Checks the agent's claims against the files it changed; mismatches fail the job with
/// structured `claim_errors`.
fn check_claims(
    claims: &shared::graph::Claims,
    wt: &Worktree,
    since: Option<&str>,
    out: &mut agent::AgentOutcome,
) {
    let Some(lang) = crate::claims::language(&claims.language) else {
        return;
    };
    let ctx = serde_json::json!({"output": out.output});
    let names = |e: &Option<String>| -> Vec<Value> {
        e.as_deref()
            .and_then(|e| shared::expr::eval(e, &ctx).ok())
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
    };
    let defines: Vec<String> = names(&claims.defines)
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    let exercises: Vec<crate::claims::Exercise> = names(&claims.exercises)
        .iter()
        .filter_map(|v| {
            Some(crate::claims::Exercise {
                test: v.get(&claims.test_field)?.as_str()?.to_string(),
                calls: v
                    .get(&claims.calls_field)?
                    .as_array()?
                    .iter()
                    .filter_map(|c| c.as_str().map(str::to_string))
                    .collect(),
            })
        })
        .collect();
    let files = match wt.changed_files(since) {
        Ok(f) => f,
        Err(e) => {
            out.status = JobStatus::Error;
            out.error = Some(format!("cannot list changed files: {e}"));
            return;
        }
    };
    let mut declared = defines.clone();
    declared.extend(exercises.iter().map(|e| e.test.clone()));
    let undeclared = crate::claims::undeclared(lang.as_ref(), &files, &declared);
    if let Some(obj) = out.output.as_object_mut() {
        obj.insert(
            "undeclared_definitions".into(),
            serde_json::json!(undeclared),
        );
    }
    let errors = crate::claims::check(lang.as_ref(), &files, &defines, &exercises);
    if !errors.is_empty() {
        out.status = JobStatus::Failed;
        out.error = Some(format!(
            "claims do not match the files on disk: {}",
            errors
                .iter()
                .map(|e| e.detail.clone())
                .collect::<Vec<_>>()
                .join("; ")
        ));
        if let Some(obj) = out.output.as_object_mut() {
            obj.insert("claim_errors".into(), serde_json::json!(errors));
        }
    }
}

impl Runner {
    /// An agent's answer: its claims checked against the worktree, then kept.
    async fn agent_done(
        &self,
        agent_node: &shared::graph::AgentBody,
        spec: &JobSpec,
        wt: &Worktree,
        mut out: agent::AgentOutcome,
        art: &mut Artifacts<'_>,
    ) -> Result<(StepOutcome, Usage), RunError> {
        if out.status == JobStatus::Ok {
            if let Some(claims) = &agent_node.claims {
                let since = spec.worktree.as_ref().and_then(|w| w.run_base.as_deref());
                let (claims, since) = (claims.clone(), since.map(str::to_string));
                out = wt
                    .blocking(move |wt| {
                        check_claims(&claims, wt, since.as_deref(), &mut out);
                        out
                    })
                    .await;
            }
        }
        agent_output(out, art).await
    }
}

/// An agent's transcript and output kept as artifacts; the step's outcome.
async fn agent_output(
    out: agent::AgentOutcome,
    art: &mut Artifacts<'_>,
) -> Result<(StepOutcome, Usage), RunError> {
    art.put_json("transcript.json", &out.transcript).await?;
    art.put_json("output.json", &out.output).await?;
    Ok((
        StepOutcome {
            status: out.status,
            output: out.output,
            error: out.error,
        },
        out.usage,
    ))
}
