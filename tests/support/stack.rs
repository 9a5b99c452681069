//! The real stack for integration tests: a coordinator and workers started as separate `fleet`
//! processes against the RabbitMQ, Redis and S3 servers that `scripts/provision.sh` started,
//! each stack in its own namespace so tests can run side by side.

use anyhow::{anyhow, bail, Context};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const REDIS_URL: &str = "redis://127.0.0.1:6379";
pub const AMQP_URL: &str = "amqp://127.0.0.1:5672/%2f";
pub const S3_ENDPOINT: &str = "http://127.0.0.1:9000";

/// The S3 endpoint a stack uses: `FLEET_TEST_S3_ENDPOINT` when set (a benchmark against
/// another S3 server on 127.0.0.1), [`S3_ENDPOINT`] otherwise.
pub fn s3_endpoint() -> String {
    std::env::var("FLEET_TEST_S3_ENDPOINT").unwrap_or_else(|_| S3_ENDPOINT.to_string())
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The `fleet` binary (built by the test command before the tests run).
pub fn fleet_bin() -> PathBuf {
    if let Ok(p) = std::env::var("FLEET_BIN") {
        return PathBuf::from(p);
    }
    workspace_root().join("target/debug/fleet")
}

/// Environment every process of a stack gets: the S3 endpoint and dummy credentials.
pub fn base_env(ns: &str) -> Vec<(String, String)> {
    [
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ENDPOINT_URL", s3_endpoint().as_str()),
        ("FLEET_STORE", "s3://fleet"),
        ("FLEET_AMQP", AMQP_URL),
        ("FLEET_REDIS", REDIS_URL),
        ("FLEET_NAMESPACE", ns),
        ("FLEET_LOG", "info,lapin=warn"),
        ("RUST_BACKTRACE", "0"),
        // Re-issue a started job 2 s after its own timeout (production default: 60 s).
        ("FLEET_REISSUE_GRACE_SECONDS", "2"),
        // The API without tokens, as for local use; the auth tests turn it off
        // (`FLEET_OPEN_API=0` in their coordinator's environment).
        ("FLEET_OPEN_API", "1"),
        // Webhook receivers of the tests listen on 127.0.0.1, an address the fleet refuses
        // unless its operator allows it (tests/tenancy_attacks.rs turns it off).
        ("FLEET_WEBHOOK_ALLOW", "127.0.0.1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The object store of namespace `ns` as the fleet's processes see it (S3 on 127.0.0.1; the
/// credentials set once in this test process, which nothing else in it reads).
pub fn s3_blobs(ns: &str) -> worker::blobs::Blobs {
    static ENV: std::sync::Once = std::sync::Once::new();
    ENV.call_once(|| {
        for (k, v) in [
            ("AWS_ENDPOINT_URL", s3_endpoint().as_str()),
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("AWS_REGION", "us-east-1"),
        ] {
            std::env::set_var(k, v);
        }
    });
    worker::blobs::Blobs::open("s3://fleet", ns).expect("s3 store")
}

pub fn unique_namespace(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after epoch")
        .subsec_nanos();
    format!(
        "t{}{}{}{}",
        tag,
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst),
        nanos % 100_000
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

struct Proc {
    child: Option<Child>,
    log: PathBuf,
}

/// What a stack starts with (`Stack::start_config`).
pub struct StackConfig<'a> {
    pub tag: &'a str,
    pub workers: usize,
    /// Jobs each worker runs at once.
    pub concurrency: usize,
    pub worker_env: &'a [(&'a str, &'a str)],
    pub coordinator_env: &'a [(&'a str, &'a str)],
    /// For every process (e.g. `FLEET_REDIS` of a private Redis).
    pub common_env: &'a [(&'a str, &'a str)],
}

impl Default for StackConfig<'_> {
    fn default() -> Self {
        StackConfig {
            tag: "stack",
            workers: 1,
            concurrency: 2,
            worker_env: &[],
            coordinator_env: &[],
            common_env: &[],
        }
    }
}

pub struct Stack {
    pub ns: String,
    pub server: String,
    pub dir: tempfile::TempDir,
    pub log_dir: PathBuf,
    coordinator: Proc,
    extra_coordinators: Vec<Proc>,
    workers: BTreeMap<String, Proc>,
    /// Where each worker serves `/metrics`.
    metrics: BTreeMap<String, String>,
    /// Extra environment of workers started from now on.
    pub worker_env: Vec<(String, String)>,
    /// Extra environment of coordinators started from now on.
    pub coordinator_env: Vec<(String, String)>,
    /// Extra environment of every process of the stack (overrides `base_env`).
    pub common_env: Vec<(String, String)>,
    /// Jobs each worker runs at once.
    pub worker_concurrency: usize,
    http: reqwest::Client,
}

impl Stack {
    /// Starts a coordinator and `workers` workers (`<ns>-w1`, `<ns>-w2`, ...).
    pub async fn start(
        tag: &str,
        workers: usize,
        worker_env: &[(&str, &str)],
    ) -> anyhow::Result<Stack> {
        Self::start_with(tag, workers, 2, worker_env).await
    }

    /// Like `start`, with `concurrency` jobs at once per worker.
    pub async fn start_with(
        tag: &str,
        workers: usize,
        concurrency: usize,
        worker_env: &[(&str, &str)],
    ) -> anyhow::Result<Stack> {
        Self::start_config(StackConfig {
            tag,
            workers,
            concurrency,
            worker_env,
            ..StackConfig::default()
        })
        .await
    }

    /// Starts a stack as `config` says.
    pub async fn start_config(config: StackConfig<'_>) -> anyhow::Result<Stack> {
        let StackConfig {
            tag,
            workers,
            concurrency,
            worker_env,
            coordinator_env,
            common_env,
        } = config;
        let owned = |env: &[(&str, &str)]| -> Vec<(String, String)> {
            env.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let ns = unique_namespace(tag);
        let log_dir = workspace_root().join("target/test-logs").join(&ns);
        std::fs::create_dir_all(&log_dir)?;
        let mut env = base_env(&ns);
        env.extend(owned(common_env));
        env.extend(owned(coordinator_env));
        let http = reqwest::Client::new();
        let (coordinator, server) =
            launch_coordinator(&http, &env, &log_dir.join("coordinator.log")).await?;
        let mut stack = Stack {
            ns: ns.clone(),
            server,
            dir: tempfile::tempdir()?,
            log_dir,
            coordinator,
            extra_coordinators: Vec::new(),
            workers: BTreeMap::new(),
            metrics: BTreeMap::new(),
            worker_env: owned(worker_env),
            coordinator_env: owned(coordinator_env),
            common_env: owned(common_env),
            worker_concurrency: concurrency,
            http,
        };
        for i in 1..=workers {
            let id = format!("{ns}-w{i}");
            stack.start_worker(&id)?;
        }
        stack.wait_workers_up(workers as u32).await?;
        Ok(stack)
    }

    /// Waits until `n` workers consume the job queue. A worker that exited because its metrics
    /// port was taken between our picking it and its binding it is started again on another
    /// port; a worker that exited for any other reason fails the stack with its log's tail.
    async fn wait_workers_up(&mut self, n: u32) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut restarts = 0;
        loop {
            let have = self.consumer_count().await?;
            if have >= n {
                return Ok(());
            }
            let ids: Vec<String> = self.workers.keys().cloned().collect();
            for id in ids {
                let Some(status) = self.worker_exit_status(&id)? else {
                    continue;
                };
                let log = std::fs::read_to_string(&self.workers[&id].log).unwrap_or_default();
                if log.contains("cannot listen on") && restarts < 3 {
                    restarts += 1;
                    self.start_worker(&id)?;
                    continue;
                }
                bail!(
                    "worker {id} exited ({status}) while starting: {}",
                    tail(&log, 20)
                );
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .workers
                    .iter()
                    .map(|(id, p)| {
                        let log = std::fs::read_to_string(&p.log).unwrap_or_default();
                        format!("--- {id}\n{}", tail(&log, 10))
                    })
                    .collect();
                bail!(
                    "{have} of {n} workers consume {}.jobs after 60 s\n{}",
                    self.ns,
                    logs.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// How the worker `id` exited, if its process has.
    fn worker_exit_status(&mut self, id: &str) -> anyhow::Result<Option<std::process::ExitStatus>> {
        let Some(p) = self.workers.get_mut(id) else {
            return Ok(None);
        };
        match p.child.as_mut() {
            Some(c) => Ok(c.try_wait()?),
            None => Ok(None),
        }
    }

    /// Consumers on the job queue now (0 while the queue is not declared yet).
    async fn consumer_count(&self) -> anyhow::Result<u32> {
        use lapin::options::QueueDeclareOptions;
        let conn =
            lapin::Connection::connect(AMQP_URL, lapin::ConnectionProperties::default()).await?;
        // A fresh channel: a passive declare of a queue not made yet closes it.
        let ch = conn.create_channel().await?;
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let queue = format!("{}.jobs", self.ns);
        let have = match ch.queue_declare(&queue, passive, Default::default()).await {
            Ok(q) => q.consumer_count(),
            Err(_) => 0,
        };
        let _ = conn.close(200, "counted").await;
        Ok(have)
    }

    /// Waits until batch `id` has finished (polling its view every 200 ms); the view.
    pub async fn wait_batch(&self, id: &str, timeout: Duration) -> anyhow::Result<Value> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let v = self.get(&format!("/v1/batches/{id}")).await?;
            if v["batch"]["finished_at"].is_string() {
                return Ok(v);
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "batch {id} not finished after {}s: {}",
                timeout.as_secs(),
                v["counts"]
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The process id of the first coordinator, while it runs.
    pub fn coordinator_pid(&self) -> Option<u32> {
        self.coordinator.child.as_ref().map(|c| c.id())
    }

    /// The process ids of the coordinators started with `start_extra_coordinator`.
    pub fn extra_coordinator_pids(&self) -> Vec<u32> {
        self.extra_coordinators
            .iter()
            .filter_map(|c| c.child.as_ref().map(|c| c.id()))
            .collect()
    }

    /// The process ids of the running workers.
    pub fn worker_pids(&self) -> Vec<u32> {
        self.workers
            .values()
            .filter_map(|w| w.child.as_ref().map(|c| c.id()))
            .collect()
    }

    pub fn worker_ids(&self) -> Vec<String> {
        self.workers.keys().cloned().collect()
    }

    /// The environment of a new coordinator of this stack.
    fn coordinator_env(&self) -> Vec<(String, String)> {
        let mut env = base_env(&self.ns);
        env.extend(self.common_env.iter().cloned());
        env.extend(self.coordinator_env.iter().cloned());
        env
    }

    pub fn start_worker(&mut self, id: &str) -> anyhow::Result<()> {
        let mut env = base_env(&self.ns);
        env.extend(self.common_env.iter().cloned());
        env.extend(self.worker_env.iter().cloned());
        let work_dir = self.dir.path().join(format!("work-{id}"));
        let log = self.log_dir.join(format!("{id}.log"));
        let metrics = free_local_addr()?;
        env.push(("FLEET_METRICS_LISTEN".into(), metrics.clone()));
        self.metrics.insert(id.to_string(), metrics);
        // Keep earlier logs of the same worker id (restarts append).
        let proc = spawn(
            &[
                "worker",
                "--id",
                id,
                "--concurrency",
                &self.worker_concurrency.to_string(),
                "--work-dir",
                &work_dir.display().to_string(),
            ],
            &env,
            &log,
        )?;
        self.workers.insert(id.to_string(), proc);
        Ok(())
    }

    /// SIGSTOP: the worker hangs (keeps its connection and its unacked job) until resumed.
    pub fn pause_worker(&self, id: &str) -> anyhow::Result<()> {
        self.signal_worker(id, "-STOP")
    }

    pub fn resume_worker(&self, id: &str) -> anyhow::Result<()> {
        self.signal_worker(id, "-CONT")
    }

    fn signal_worker(&self, id: &str, signal: &str) -> anyhow::Result<()> {
        let pid = self
            .workers
            .get(id)
            .and_then(|p| p.child.as_ref())
            .map(|c| c.id())
            .ok_or_else(|| anyhow!("no running worker {id}"))?;
        let st = Command::new("kill")
            .arg(signal)
            .arg(pid.to_string())
            .status()?;
        anyhow::ensure!(st.success(), "kill {signal} {pid} failed");
        Ok(())
    }

    /// SIGTERM, as an orderly stop: waits for the worker to exit.
    pub fn stop_worker(&mut self, id: &str) -> anyhow::Result<()> {
        self.signal_worker(id, "-TERM")?;
        let p = self
            .workers
            .get_mut(id)
            .ok_or_else(|| anyhow!("no worker {id}"))?;
        if let Some(mut c) = p.child.take() {
            c.wait()?;
        }
        Ok(())
    }

    /// SIGKILL, as a crash would.
    pub fn kill_worker(&mut self, id: &str) -> anyhow::Result<()> {
        let p = self
            .workers
            .get_mut(id)
            .ok_or_else(|| anyhow!("no worker {id}"))?;
        if let Some(mut c) = p.child.take() {
            c.kill()?;
            c.wait()?;
        }
        Ok(())
    }

    /// Starts a new coordinator process (new port) on the same namespace, as a replacement for
    /// one that died.
    pub async fn restart_coordinator(&mut self) -> anyhow::Result<()> {
        self.kill_coordinator()?;
        let (proc, server) = launch_coordinator(
            &self.http,
            &self.coordinator_env(),
            &self.log_dir.join("coordinator-2.log"),
        )
        .await?;
        self.coordinator = proc;
        self.server = server;
        Ok(())
    }

    /// Starts another coordinator on the same namespace, side by side with the first (it
    /// competes for results and publishes from the shared outbox).
    pub fn start_extra_coordinator(&mut self) -> anyhow::Result<()> {
        let port = free_port();
        let n = self.extra_coordinators.len() + 2;
        let proc = spawn(
            &["coordinator", "--listen", &format!("127.0.0.1:{port}")],
            &self.coordinator_env(),
            &self.log_dir.join(format!("coordinator-{n}.log")),
        )?;
        self.extra_coordinators.push(proc);
        Ok(())
    }

    /// As `start_extra_coordinator`, once it answers; its address.
    pub async fn start_serving_coordinator(&mut self) -> anyhow::Result<String> {
        let n = self.extra_coordinators.len() + 2;
        let log = self.log_dir.join(format!("coordinator-{n}.log"));
        let http = reqwest::Client::new();
        let (proc, server) = launch_coordinator(&http, &self.coordinator_env(), &log).await?;
        self.extra_coordinators.push(proc);
        Ok(server)
    }

    /// Submits the factory example whose SE agent waits `delay` seconds before answering (a job
    /// that runs long enough to be killed, paused or cancelled); returns the run id.
    pub fn submit_slow_factory(&self, delay: f64) -> anyhow::Result<String> {
        let repo = make_calc_repo(self.dir.path())?.display().to_string();
        let mut script: Value = serde_json::from_str(&std::fs::read_to_string(example(
            "factory-calc/script-pass.json",
        ))?)?;
        script["se"][0]["delay_seconds"] = serde_json::json!(delay);
        let path = self.dir.path().join("slow.json");
        std::fs::write(&path, serde_json::to_vec(&script)?)?;
        let out = self.cli(&[
            "submit",
            "--repo",
            &repo,
            "--work-order",
            &example("factory-calc/work_order.json"),
            "--script",
            &path.display().to_string(),
        ])?;
        anyhow::ensure!(out.code == 0, "submit failed: {}", out.stderr);
        Ok(out.stdout.trim().to_string())
    }

    pub fn kill_coordinator(&mut self) -> anyhow::Result<()> {
        if let Some(mut c) = self.coordinator.child.take() {
            c.kill()?;
            c.wait()?;
        }
        Ok(())
    }

    pub fn log(&self, id: &str) -> String {
        let path = if id == "coordinator" {
            self.coordinator.log.clone()
        } else {
            self.workers
                .get(id)
                .map(|p| p.log.clone())
                .unwrap_or_default()
        };
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// The sum of a worker's samples of `metric` whose labels contain every `labels` pair
    /// (`key="value"`), read from its `/metrics`.
    pub async fn worker_metric(
        &self,
        id: &str,
        metric: &str,
        labels: &[(&str, &str)],
    ) -> anyhow::Result<f64> {
        let text = self.worker_metrics_text(id).await?;
        Ok(sum_samples(&text, metric, labels))
    }

    /// A worker's `/metrics` page, for several reads of one moment (`sum_samples`).
    pub async fn worker_metrics_text(&self, id: &str) -> anyhow::Result<String> {
        let addr = self
            .metrics
            .get(id)
            .ok_or_else(|| anyhow!("no worker {id}"))?;
        Ok(self
            .http
            .get(format!("http://{addr}/metrics"))
            .send()
            .await?
            .text()
            .await?)
    }

    /// Waits until a worker's `metric` (see `worker_metric`) reaches `at_least`: what the
    /// worker did, read from its state rather than its log.
    pub async fn wait_for_metric(
        &self,
        id: &str,
        metric: &str,
        labels: &[(&str, &str)],
        at_least: f64,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let what = format!("{metric}{labels:?} of {id}");
        poll_until_at_least(&what, at_least, timeout, || async {
            self.worker_metric(id, metric, labels).await.unwrap_or(0.0)
        })
        .await
    }

    /// Waits until the coordinator's `metric` (its `/metrics`) reaches `at_least`.
    pub async fn wait_for_coordinator_metric(
        &self,
        metric: &str,
        at_least: f64,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let what = format!("the coordinator's {metric}");
        poll_until_at_least(&what, at_least, timeout, || async {
            match self.get_text("/metrics").await {
                Ok(text) => sum_samples(&text, metric, &[]),
                Err(_) => 0.0,
            }
        })
        .await
    }

    /// Sends a GET, once more after a transport error (a pooled connection the server closed
    /// as it was reused: "connection closed before message completed"); a GET is idempotent.
    async fn send_get(&self, path: &str) -> anyhow::Result<reqwest::Response> {
        let url = format!("{}{path}", self.server);
        match self.http.get(&url).send().await {
            Ok(r) => Ok(r),
            Err(e) if e.is_request() || e.is_connect() => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(self.http.get(&url).send().await?)
            }
            Err(e) => Err(e.into()),
        }
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let r = self.send_get(path).await?;
        let status = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("GET {path}: {status}: {v}");
        }
        Ok(v)
    }

    /// `POST path` of `body` as JSON: the answer's status and JSON body, whatever the status.
    pub async fn post_answer(&self, path: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
        let r = (self.http.post(format!("{}{path}", self.server)))
            .json(body)
            .send()
            .await?;
        let status = r.status().as_u16();
        Ok((status, r.json().await.unwrap_or(Value::Null)))
    }

    /// `GET path`'s status and JSON body, whatever the status.
    pub async fn get_answer(&self, path: &str) -> anyhow::Result<(u16, Value)> {
        let r = self.send_get(path).await?;
        let status = r.status().as_u16();
        Ok((status, r.json().await.unwrap_or(Value::Null)))
    }

    pub async fn get_text(&self, path: &str) -> anyhow::Result<String> {
        let r = self.send_get(path).await?;
        if !r.status().is_success() {
            bail!("GET {path}: {}", r.status());
        }
        Ok(r.text().await?)
    }

    /// `GET path`'s body as bytes (an artifact that is not text: a screenshot).
    pub async fn get_bytes(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        let r = self.send_get(path).await?;
        if !r.status().is_success() {
            bail!("GET {path}: {}", r.status());
        }
        Ok(r.bytes().await?.to_vec())
    }

    pub async fn artifact_json(&self, key: &str) -> anyhow::Result<Value> {
        let text = self.get_text(&format!("/v1/artifacts/{key}")).await?;
        serde_json::from_str(&text).with_context(|| format!("artifact {key} is not json"))
    }

    /// The key of artifact `name` of `node`'s visit `visit`, as the run points to it: the
    /// accepted execution's (read from the run's log, never guessed from a layout).
    pub async fn artifact_key(
        &self,
        run: &str,
        node: &str,
        visit: u32,
        name: &str,
    ) -> anyhow::Result<String> {
        let logs = self.get(&format!("/v1/runs/{run}/logs")).await?;
        let entry = logs
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["node"] == node && e["visit"] == visit && e["artifacts"][name].is_string())
            .with_context(|| {
                format!("run {run} has no artifact `{name}` of {node} visit {visit}: {logs}")
            })?;
        let key = entry["artifacts"][name]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let execution = entry["execution"].as_str().unwrap_or_default();
        anyhow::ensure!(
            !execution.is_empty() && key.contains(&format!("/exec-{execution}/")),
            "artifact {key} lies in the accepted execution's folder (`{execution}`)"
        );
        Ok(key)
    }

    /// Artifact `name` of `node`'s visit `visit` (see `artifact_key`), as JSON.
    pub async fn node_artifact_json(
        &self,
        run: &str,
        node: &str,
        visit: u32,
        name: &str,
    ) -> anyhow::Result<Value> {
        let key = self.artifact_key(run, node, visit, name).await?;
        self.artifact_json(&key).await
    }

    /// Artifact `name` of `node`'s visit `visit` (see `artifact_key`), as text.
    pub async fn node_artifact_text(
        &self,
        run: &str,
        node: &str,
        visit: u32,
        name: &str,
    ) -> anyhow::Result<String> {
        let key = self.artifact_key(run, node, visit, name).await?;
        self.get_text(&format!("/v1/artifacts/{key}")).await
    }

    /// Polls the run every 100 ms until it is terminal; returns its status view.
    pub async fn wait_run(&self, run: &str, timeout: Duration) -> anyhow::Result<Value> {
        self.wait_run_every(run, timeout, Duration::from_millis(100))
            .await
    }

    pub async fn wait_run_every(
        &self,
        run: &str,
        timeout: Duration,
        every: Duration,
    ) -> anyhow::Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.get(&format!("/v1/runs/{run}")).await?;
            if matches!(
                v["status"].as_str(),
                Some("succeeded" | "failed" | "cancelled")
            ) {
                return Ok(v);
            }
            if Instant::now() > deadline {
                bail!(
                    "run {run} not finished after {timeout:?}: {v}\ncoordinator log:\n{}",
                    self.log("coordinator")
                );
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Waits for the run's end as a client told by the API does (`result?wait_seconds`, no
    /// polling: a status read of a big run renders every one of its jobs).
    pub async fn wait_run_told(&self, run: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let (code, body) = self
                .get_answer(&format!("/v1/runs/{run}/result?wait_seconds=60"))
                .await?;
            match code {
                200 => return Ok(()),
                409 if Instant::now() < deadline => continue,
                _ => bail!("run {run}: {code} {body}"),
            }
        }
    }

    /// Runs the `fleet` CLI against this stack.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<CliOutput> {
        self.cli_env(args, &[])
    }

    /// The run's event log of one type (`fleet events RUN --type KIND`), one value per line.
    pub fn events(&self, run: &str, kind: &str) -> anyhow::Result<Vec<Value>> {
        let out = self.cli(&["events", run, "--type", kind])?;
        anyhow::ensure!(out.code == 0, "events failed: {}", out.stderr);
        out.stdout
            .lines()
            .map(|l| Ok(serde_json::from_str(l)?))
            .collect()
    }

    /// Runs the `fleet` CLI against this stack with `extra` in its environment (a token).
    pub fn cli_env(&self, args: &[&str], extra: &[(&str, &str)]) -> anyhow::Result<CliOutput> {
        let mut env = base_env(&self.ns);
        env.extend(self.common_env.iter().cloned());
        env.push(("FLEET_SERVER".into(), self.server.clone()));
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        run_cli(args, &env)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        for p in self
            .workers
            .values_mut()
            .chain(self.extra_coordinators.iter_mut())
            .chain(std::iter::once(&mut self.coordinator))
        {
            if let Some(mut c) = p.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        for id in self.workers.keys() {
            remove_containers(&format!("fleet.worker={id}"));
        }
        // The overlays of jobs its killed workers were running (a worker unmounts them when it
        // starts again; these will not start again), before the folder is removed.
        worker::git::layered::unmount_within(self.dir.path());
        delete_queues(&self.ns);
    }
}

/// Deletes a namespace's queues, so test runs do not pile quorum queues up in the broker.
pub fn delete_queues(ns: &str) {
    let ns = ns.to_string();
    let cleanup = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            let Ok(conn) =
                lapin::Connection::connect(AMQP_URL, lapin::ConnectionProperties::default()).await
            else {
                return;
            };
            if let Ok(ch) = conn.create_channel().await {
                for suffix in ["jobs", "results", "jobs.dead"] {
                    let _ = ch
                        .queue_delete(&format!("{ns}.{suffix}"), Default::default())
                        .await;
                }
                // The queues of the images the tests' workers may hold, and the routing.
                for image in ["fleet-agent-py:1", "fleet-agent-hs:1", "held:1", "left:1"] {
                    let queue = worker::queue::ImageKey::of(image).queue(&ns);
                    let _ = ch.queue_delete(&queue, Default::default()).await;
                }
                for exchange in ["jobs.images", "jobs.any"] {
                    let _ = ch
                        .exchange_delete(&format!("{ns}.{exchange}"), Default::default())
                        .await;
                }
            }
            let _ = conn.close(200, "test done").await;
        });
    });
    let _ = cleanup.join();
}

/// The token a `fleet token bootstrap` or `create` printed (its first line).
pub fn token_of(out: &CliOutput) -> anyhow::Result<String> {
    anyhow::ensure!(out.code == 0, "token command failed: {}", out.stderr);
    Ok(out
        .stdout
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string())
}

pub struct CliOutput {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn run_cli(args: &[&str], env: &[(String, String)]) -> anyhow::Result<CliOutput> {
    let out = Command::new(fleet_bin())
        .args(args)
        .envs(env.iter().cloned())
        .current_dir(workspace_root())
        .output()
        .with_context(|| format!("cannot run {}", fleet_bin().display()))?;
    Ok(CliOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Starts a coordinator on a free port and waits until it answers there. Its own log must say it
/// listens on that port: a process that took the port between our picking it and the
/// coordinator binding it would answer a health check too. A coordinator that lost its port
/// that way is started again on another (up to 5 tries). Returns it and its address.
async fn launch_coordinator(
    http: &reqwest::Client,
    env: &[(String, String)],
    log: &Path,
) -> anyhow::Result<(Proc, String)> {
    for _ in 0..5 {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let server = format!("http://{listen}");
        let mut proc = spawn(&["coordinator", "--listen", &listen], env, log)?;
        let (ready, lost) = (
            format!("listening on {server}"),
            format!("cannot listen on {listen}"),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if text.contains(&ready) {
                let healthy = http.get(format!("{server}/healthz")).send().await;
                if healthy.is_ok_and(|r| r.status().is_success()) {
                    return Ok((proc, server));
                }
            }
            let exited = match proc.child.as_mut() {
                Some(c) => c.try_wait()?.is_some(),
                None => true,
            };
            if exited && text.contains(&lost) {
                break;
            }
            if exited || Instant::now() > deadline {
                bail!("coordinator not healthy:\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    bail!("the coordinator found no free port in 5 tries")
}

fn spawn(args: &[&str], env: &[(String, String)], log: &Path) -> anyhow::Result<Proc> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let child = Command::new(fleet_bin())
        .args(args)
        .envs(env.iter().cloned())
        .current_dir(workspace_root())
        .stdout(Stdio::from(file.try_clone()?))
        .stderr(Stdio::from(file))
        .spawn()
        .with_context(|| format!("cannot start {} (build it first)", fleet_bin().display()))?;
    Ok(Proc {
        child: Some(child),
        log: log.to_path_buf(),
    })
}

/// Container ids matching a docker label filter (`key=value`), running or not.
pub fn containers(label: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label={label}")])
        .output();
    match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_string)
            .filter(|l| !l.is_empty())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Waits until a container with the label (`key=value`) exists; returns its id.
pub async fn wait_for_container(label: &str) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(id) = containers(label).into_iter().next() {
            return Ok(id);
        }
        anyhow::ensure!(Instant::now() < deadline, "no container with {label}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of a label on a container.
pub fn container_label(id: &str, label: &str) -> Option<String> {
    let out = Command::new("docker")
        .args([
            "inspect",
            "-f",
            &format!("{{{{index .Config.Labels \"{label}\"}}}}"),
            id,
        ])
        .output()
        .ok()?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!v.is_empty()).then_some(v)
}

fn remove_containers(label: &str) {
    let ids = containers(label);
    if !ids.is_empty() {
        let _ = Command::new("docker")
            .arg("rm")
            .arg("-f")
            .args(&ids)
            .output();
    }
}

/// A fresh git repository of `examples/factory-calc/repo` under `dir`.
pub fn make_calc_repo(dir: &Path) -> anyhow::Result<PathBuf> {
    let dest = dir.join("calc-repo");
    let out = Command::new(workspace_root().join("examples/factory-calc/make-repo.sh"))
        .arg(&dest)
        .output()?;
    if !out.status.success() {
        bail!(
            "make-repo.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(dest)
}

/// Writes `files` (relative path, contents) into the repository at `repo` and folds them into
/// its last commit (`git commit --amend`), so the repository still has one commit.
pub fn amend_repo(repo: &Path, files: &[(&str, &str)]) -> anyhow::Result<()> {
    for (path, body) in files {
        let p = repo.join(path);
        std::fs::create_dir_all(p.parent().expect("a relative path"))?;
        std::fs::write(&p, body)?;
    }
    for args in [
        vec!["add", "-A"],
        vec![
            "-c",
            "user.name=fleet",
            "-c",
            "user.email=fleet@localhost",
            "commit",
            "-q",
            "--amend",
            "--no-edit",
        ],
    ] {
        let st = Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(&args)
            .status()?;
        anyhow::ensure!(st.success(), "git {args:?} failed");
    }
    Ok(())
}

pub fn example(path: &str) -> String {
    workspace_root()
        .join("examples")
        .join(path)
        .display()
        .to_string()
}

/// Writes the factory example's work order with a PO step that takes `seconds` (its first
/// acceptance command sleeps) into the stack's folder; returns its path.
pub fn slow_po_work_order(dir: &Path, seconds: u32) -> anyhow::Result<PathBuf> {
    let mut order: Value = serde_json::from_str(&std::fs::read_to_string(example(
        "factory-calc/work_order.json",
    ))?)?;
    let mut commands = vec![Value::from(format!(
        "python -c \"import time; time.sleep({seconds})\""
    ))];
    commands.extend(
        order["acceptance_commands"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
    );
    order["acceptance_commands"] = Value::from(commands);
    let path = dir.join("slow_po_work_order.json");
    std::fs::write(&path, serde_json::to_vec(&order)?)?;
    Ok(path)
}

/// Reads a figure every 50 ms until it reaches `at_least`; fails after `timeout` naming `what`.
async fn poll_until_at_least<F, Fut>(
    what: &str,
    at_least: f64,
    timeout: Duration,
    mut read: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = f64>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let now = read().await;
        if now >= at_least {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("{what} is {now} after {timeout:?}, not {at_least}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A free address on 127.0.0.1 for a process to listen on.
fn free_local_addr() -> anyhow::Result<String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.to_string())
}

/// The sum of the samples of `metric` in a Prometheus text exposition whose labels contain
/// every pair of `labels`.
pub fn sum_samples(text: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name_labels, value) = l.rsplit_once(' ')?;
            let (name, rest) = match name_labels.split_once('{') {
                Some((n, r)) => (n, r),
                None => (name_labels, ""),
            };
            (name == metric
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())
            .flatten()
        })
        .sum()
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
