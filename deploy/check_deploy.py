"""Offline checks of the deployment files; run by scripts/check-deploy.sh (which installs the
packages this needs into a virtual environment). Every failure is printed; the exit code is 1
when there was one.

- deploy/k8s/*.yaml: built-in kinds against the Kubernetes schemas bundled by
  `kubernetes-validate` (strict: unknown fields fail), KEDA kinds against the schemas written
  here from KEDA's documentation (deploy/k8s/schemas/, which refuse unknown fields too), then
  what no schema sees: names that must match each other, environment variables the binary
  reads, probe paths it serves, the queue name the workers consume.
- the output of `kubectl kustomize deploy/k8s` (when kubectl is installed), the same way.
- deploy/grafana/*.json: every query names metrics and labels that coordinator/src/metrics.rs
  and worker/src/metrics.rs register; panel ids are unique; panels do not overlap.
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
SCHEMAS = K8S / "schemas"
GRAFANA = ROOT / "deploy" / "grafana"
SOURCES = [ROOT / "coordinator" / "src", ROOT / "worker" / "src", ROOT / "shared" / "src"]
METRIC_FILES = [ROOT / "coordinator" / "src" / "metrics.rs", ROOT / "worker" / "src" / "metrics.rs"]
# The oldest Kubernetes minor these manifests are meant for, and the newest the package has.
K8S_VERSIONS = ["1.30.0", kubernetes_validate.utils.latest_version()]

failures = []


def fail(where, message):
    failures.append(f"{where}: {message}")


def rel(path):
    return str(Path(path).relative_to(ROOT))


# ---------------------------------------------------------------- Kubernetes and KEDA schemas


def load_json(path):
    with open(path) as f:
        return json.load(f)


# Written by hand from KEDA's documentation (deploy/k8s/schemas/README.md): each names the fields
# an object may have and refuses others (additionalProperties: false), as the API server does.
KEDA = {
    ("keda.sh/v1alpha1", "ScaledObject"): load_json(SCHEMAS / "keda-scaledobject-v1alpha1.json"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"): load_json(SCHEMAS / "keda-triggerauthentication-v1alpha1.json"),
}
TRIGGER_METADATA = {"rabbitmq": load_json(SCHEMAS / "keda-rabbitmq-trigger.json")}


def schema_errors(schema, doc):
    validator = jsonschema.Draft202012Validator(schema)
    for e in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
        yield ".".join(str(p) for p in e.absolute_path) or "(top)", e.message


def validate_keda(where, doc):
    key = (doc.get("apiVersion"), doc.get("kind"))
    if not isinstance(doc.get("metadata"), dict) or not doc["metadata"].get("name"):
        fail(where, "metadata.name is missing")
    for path, message in schema_errors(KEDA[key], doc):
        fail(where, f"{path}: {message}")
    spec = doc.get("spec") or {}
    if doc["kind"] == "ScaledObject" and isinstance(spec, dict):
        # What KEDA refuses and a JSON schema cannot say: min <= max replicas (max defaults to
        # 100), and idleReplicaCount below minReplicaCount (which defaults to 0).
        lo, hi = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
        if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
            fail(where, "spec: minReplicaCount must be less than or equal to maxReplicaCount")
        idle = spec.get("idleReplicaCount")
        if isinstance(idle, int) and isinstance(lo, int) and idle >= lo:
            fail(where, "spec: idleReplicaCount must be less than minReplicaCount")
        for i, trigger in enumerate(spec.get("triggers") or []):
            schema = TRIGGER_METADATA.get(trigger.get("type"))
            if schema is None:
                fail(where, f"spec.triggers.{i}: no schema here for trigger type {trigger.get('type')!r}")
                continue
            for path, message in schema_errors(schema, trigger.get("metadata") or {}):
                fail(where, f"spec.triggers.{i}.metadata.{path}: {message}")


def validate_doc(where, doc):
    if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
        fail(where, "not a Kubernetes object (apiVersion and kind)")
        return
    if (doc["apiVersion"], doc["kind"]) in KEDA:
        validate_keda(where, doc)
        return
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path) or "(top)"
            fail(where, f"{path}: {e.message} (Kubernetes {e.version} schema)")
            return
        except kubernetes_validate.utils.SchemaNotFoundError as e:
            fail(where, e.message)
            return


def name_of(doc):
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


# ---------------------------------------------------------------- what no schema sees


def rust_text():
    return "\n".join(p.read_text() for src in SOURCES for p in src.rglob("*.rs"))


def env_names_read(text):
    """Environment variables the binary names in its source (clap `env = "X"`, env::var("X"),
    small helpers like env("X")): every quoted upper-case name with an underscore."""
    return set(re.findall(r'"([A-Z][A-Z0-9]*_[A-Z0-9_]+)"', text))


def containers(doc):
    spec = (((doc.get("spec") or {}).get("template") or {}).get("spec")) or {}
    return spec.get("containers") or []


def probe_paths(container):
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = (container.get(probe) or {}).get("httpGet")
        if get:
            yield probe, get.get("path"), get.get("port")


def check_references(docs):
    """Names that must match between objects, and between the objects and the code."""
    by_kind = {}
    for where, doc in docs:
        by_kind.setdefault(doc.get("kind"), {})[(doc.get("metadata") or {}).get("name")] = (where, doc)
    configmaps = {n: d for n, (_, d) in by_kind.get("ConfigMap", {}).items()}
    secrets = {n: d for n, (_, d) in by_kind.get("Secret", {}).items()}
    deployments = by_kind.get("Deployment", {})

    def keys(doc):
        return set((doc.get("data") or {}).keys()) | set((doc.get("stringData") or {}).keys())

    code = rust_text()
    read = env_names_read(code)
    api = (ROOT / "coordinator" / "src" / "api.rs").read_text()
    public_routes = set(re.findall(r'at\(Get,\s*"([^"]+)",\s*[\w:]+\)\.public\(\)', api))
    serve = (ROOT / "coordinator" / "src" / "cli" / "serve.rs").read_text()
    worker_routes = set(re.findall(r'\.route\(\s*"([^"]+)"', serve))
    served = {"coordinator": public_routes, "worker": worker_routes}

    for name, (where, doc) in deployments.items():
        template = (doc.get("spec") or {}).get("template") or {}
        labels = (template.get("metadata") or {}).get("labels") or {}
        selector = ((doc.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            fail(where, f"{name_of(doc)}: spec.selector does not match the pod template's labels")
        for c in containers(doc):
            args = c.get("args") or []
            role = args[0] if args else None
            if role not in served:
                fail(where, f"{name_of(doc)}: container {c.get('name')} runs `fleet {role}`, not coordinator or worker")
                continue
            env = {e.get("name"): e for e in c.get("env") or []}
            names = set(env)
            for source in c.get("envFrom") or []:
                if "configMapRef" in source:
                    ref = source["configMapRef"].get("name")
                    if ref not in configmaps:
                        fail(where, f"{name_of(doc)}: envFrom names ConfigMap {ref!r}, which no manifest defines")
                    else:
                        names |= keys(configmaps[ref])
                if "secretRef" in source:
                    ref = source["secretRef"].get("name")
                    if ref not in secrets:
                        fail(where, f"{name_of(doc)}: envFrom names Secret {ref!r}, which secrets.example.yaml does not define")
                    else:
                        names |= keys(secrets[ref])
            # A variable only expanded into others ($(POD_NAME)) is not for the binary.
            expanded = set()
            for e in env.values():
                expanded |= set(re.findall(r"\$\(([A-Za-z0-9_]+)\)", str(e.get("value", ""))))
            for n in sorted(names - expanded):
                if n not in read and not n.startswith("AWS_"):
                    fail(where, f"{name_of(doc)}: environment variable {n} is read nowhere in coordinator/, worker/ or shared/ (AWS_* go to the S3 client)")
            ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
            listen = {"coordinator": "FLEET_LISTEN", "worker": "FLEET_METRICS_LISTEN"}[role]
            address = str((env.get(listen) or {}).get("value", ""))
            if not address.startswith("0.0.0.0:"):
                fail(where, f"{name_of(doc)}: {listen} must listen on 0.0.0.0:<port> for probes and scrapes, not {address!r}")
            scrape = (template.get("metadata") or {}).get("annotations") or {}
            checked = list(probe_paths(c))
            if "prometheus.io/path" in scrape:
                checked.append(("the prometheus.io annotations", scrape["prometheus.io/path"], scrape.get("prometheus.io/port")))
            for probe, path, port in checked:
                if path not in served[role]:
                    fail(where, f"{name_of(doc)}: {probe} asks for {path}, which `fleet {role}` does not serve (it serves {sorted(served[role])})")
                number = ports.get(port, port)
                if address and str(number) != address.rsplit(":", 1)[-1]:
                    fail(where, f"{name_of(doc)}: {probe} port {port} is not the port of {listen}={address}")
            if not (c.get("resources") or {}).get("requests"):
                fail(where, f"{name_of(doc)}: container {c.get('name')} has no resource requests")

    pods = {n: ((d.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {}
            for n, (_, d) in deployments.items()}

    def selects(selector):
        return [n for n, labels in pods.items() if selector and all(labels.get(k) == v for k, v in selector.items())]

    for kind, field in (("Service", ("spec", "selector")), ("PodDisruptionBudget", ("spec", "selector", "matchLabels"))):
        for name, (where, doc) in by_kind.get(kind, {}).items():
            sel = doc
            for f in field:
                sel = (sel or {}).get(f)
            if not selects(sel):
                fail(where, f"{kind}/{name}: its selector matches the pods of no Deployment")

    auths = by_kind.get("TriggerAuthentication", {})
    for name, (where, doc) in auths.items():
        for ref in (doc.get("spec") or {}).get("secretTargetRef") or []:
            secret = secrets.get(ref.get("name"))
            if secret is None or ref.get("key") not in keys(secret):
                fail(where, f"TriggerAuthentication/{name}: Secret {ref.get('name')!r} key {ref.get('key')!r} is not in secrets.example.yaml")
    queue = re.search(r'QueueName::Jobs\s*=>\s*format!\("\{namespace\}([^"]*)"\)',
                      (ROOT / "worker" / "src" / "queue.rs").read_text())
    for name, (where, doc) in by_kind.get("ScaledObject", {}).items():
        spec = doc.get("spec") or {}
        target = (spec.get("scaleTargetRef") or {}).get("name")
        if target not in deployments:
            fail(where, f"ScaledObject/{name}: scaleTargetRef names {target!r}, which is no Deployment here")
        for i, trigger in enumerate(spec.get("triggers") or []):
            ref = (trigger.get("authenticationRef") or {}).get("name")
            if ref is not None and ref not in auths:
                fail(where, f"ScaledObject/{name}: trigger {i} names TriggerAuthentication {ref!r}, which no manifest defines")
            params = {p.get("parameter") for p in ((auths.get(ref) or (None, {}))[1].get("spec") or {}).get("secretTargetRef") or []}
            meta = trigger.get("metadata") or {}
            if trigger.get("type") == "rabbitmq":
                if not ({"host", "hostFromEnv"} & set(meta)) and "host" not in params:
                    fail(where, f"ScaledObject/{name}: trigger {i} has no RabbitMQ host (metadata or TriggerAuthentication)")
                if queue is None:
                    fail("worker/src/queue.rs", "cannot find how the jobs queue is named (QueueName::Jobs => format!(...))")
                    continue
                worker = deployments.get(target, (None, {}))[1]
                spaces = set()
                for c in containers(worker):
                    for source in c.get("envFrom") or []:
                        cm = configmaps.get((source.get("configMapRef") or {}).get("name"))
                        if cm and "FLEET_NAMESPACE" in (cm.get("data") or {}):
                            spaces.add(cm["data"]["FLEET_NAMESPACE"])
                    for e in c.get("env") or []:
                        if e.get("name") == "FLEET_NAMESPACE":
                            spaces = {e.get("value")}
                namespace = spaces.pop() if len(spaces) == 1 else "fleet"  # the binary's default
                expected = namespace + queue.group(1)
                if meta.get("queueName") != expected:
                    fail(where, f"ScaledObject/{name}: trigger {i} watches queue {meta.get('queueName')!r}, but the workers consume {expected!r} (FLEET_NAMESPACE={namespace})")


def check_example_secrets(path, docs):
    if not path.name.endswith(".example.yaml"):
        return
    for doc in docs:
        if doc.get("kind") != "Secret":
            fail(rel(path), f"{name_of(doc)}: an example file holds Secrets only")
            continue
        if doc.get("data"):
            fail(rel(path), f"{name_of(doc)}: use stringData with placeholders, not data")
        for key, value in (doc.get("stringData") or {}).items():
            if "CHANGE-ME" not in str(value):
                fail(rel(path), f"{name_of(doc)}: {key} is not a placeholder (must contain CHANGE-ME)")


def check_k8s():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = kustomization.get("resources") or []
    files = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    for p in files:
        if p.name not in listed and not p.name.endswith(".example.yaml"):
            fail(rel(p), "not listed in kustomization.yaml's resources (or name it *.example.yaml)")
    for name in listed:
        if not (K8S / name).is_file():
            fail("deploy/k8s/kustomization.yaml", f"lists {name}, which does not exist")
    docs = []
    for p in files:
        try:
            items = [d for d in yaml.safe_load_all(p.read_text()) if d is not None]
        except yaml.YAMLError as e:
            fail(rel(p), f"not YAML: {e}")
            continue
        for d in items:
            validate_doc(f"{rel(p)} {name_of(d)}", d)
            docs.append((rel(p), d))
        check_example_secrets(p, items)
    check_references(docs)
    kinds = sorted({d.get("kind") for _, d in docs})
    print(f"  {len(docs)} objects in {len(files)} files ({', '.join(kinds)}), Kubernetes schemas {' and '.join(v.rsplit('.', 1)[0] for v in K8S_VERSIONS)} (strict)")
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("  kubectl not installed: the kustomize build was not checked")
        return
    built = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
    if built.returncode != 0:
        fail("deploy/k8s/kustomization.yaml", f"kubectl kustomize failed: {built.stderr.strip()}")
        return
    out = [d for d in yaml.safe_load_all(built.stdout) if d is not None]
    for d in out:
        validate_doc(f"kustomize build {name_of(d)}", d)
        if d.get("kind") != "Namespace" and (d.get("metadata") or {}).get("namespace") != kustomization.get("namespace"):
            fail(f"kustomize build {name_of(d)}", "not in the kustomization's namespace")
    print(f"  kubectl kustomize deploy/k8s: {len(out)} objects, validated the same way")


# ---------------------------------------------------------------- Grafana

PROMQL_WORDS = {
    # aggregations, functions and keywords of PromQL
    "sum", "avg", "min", "max", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "rate", "irate", "increase", "delta", "idelta", "deriv",
    "histogram_quantile", "histogram_fraction", "abs", "ceil", "floor", "round", "clamp",
    "clamp_min", "clamp_max", "vector", "scalar", "time", "label_replace", "label_join", "sort",
    "sort_desc", "absent", "absent_over_time", "avg_over_time", "sum_over_time", "max_over_time",
    "min_over_time", "count_over_time", "last_over_time", "quantile_over_time", "resets",
    "changes", "predict_linear", "exp", "ln", "log2", "log10", "sqrt", "timestamp", "and", "or",
    "unless", "offset", "bool", "by", "without", "on", "ignoring", "group_left", "group_right",
}


def registered_metrics():
    """{series name: label names} of every metric the two metrics.rs files register; a
    histogram's _bucket (with `le`), _sum and _count series."""
    metrics = {}
    for path in METRIC_FILES:
        text = path.read_text()
        named = set(re.findall(r'"(fleet_[a-z0-9_]+)"', text))
        found = {}
        for m in re.finditer(r'Int(Counter|Gauge)::new\(\s*"(fleet_[a-z0-9_]+)"', text):
            found[m.group(2)] = (m.group(1).lower(), [])
        vec = re.compile(
            r'(Histogram)?Opts::new\(\s*"(fleet_[a-z0-9_]+)"\s*,\s*"(?:[^"\\]|\\.)*"\s*,?\s*\)'
            r'(?:\s*\.buckets\(vec!\[[^\]]*\]\))?\s*,\s*&\[([^\]]*)\]'
        )
        for m in vec.finditer(text):
            labels = re.findall(r'"([a-z_]+)"', m.group(3))
            found[m.group(2)] = ("histogram" if m.group(1) else "counter", labels)
        for name in sorted(named - set(found)):
            fail(rel(path), f"metric {name}: cannot read its kind and labels (the check's parser needs a change)")
        for name, (kind, labels) in found.items():
            if kind == "histogram":
                metrics[name + "_bucket"] = set(labels) | {"le"}
                metrics[name + "_sum"] = set(labels)
                metrics[name + "_count"] = set(labels)
            else:
                metrics[name] = set(labels)
    return metrics


def promql_names(expr):
    """(metric names, label names) an expression uses."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    labels = set()
    for block in re.findall(r"\{([^}]*)\}", text):
        labels |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", block))
    text = re.sub(r"\{[^}]*\}", " ", text)
    for block in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", text):
        labels |= {w.strip() for w in block.split(",") if w.strip()}
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)
    words = re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text)
    return {w for w in words if w not in PROMQL_WORDS and not re.fullmatch(r"[eE]\d*|inf|nan|Inf|NaN", w)}, labels


def all_panels(panels):
    for p in panels:
        yield p
        yield from all_panels(p.get("panels") or [])


def check_grafana():
    metrics = registered_metrics()
    dashboards = sorted(GRAFANA.glob("*.json"))
    if not dashboards:
        fail("deploy/grafana", "no dashboard")
    for path in dashboards:
        where = rel(path)
        try:
            dash = load_json(path)
        except json.JSONDecodeError as e:
            fail(where, f"not JSON: {e}")
            continue
        inputs = {i.get("name") for i in dash.get("__inputs") or []}
        if "DS_PROMETHEUS" not in inputs:
            fail(where, "no DS_PROMETHEUS datasource input")
        panels = list(all_panels(dash.get("panels") or []))
        ids = [p.get("id") for p in panels]
        for i in sorted({i for i in ids if ids.count(i) > 1}, key=str):
            fail(where, f"panel id {i} is used {ids.count(i)} times")
        for p in panels:
            if not isinstance(p.get("id"), int):
                fail(where, f"panel {p.get('title')!r} has no integer id")
        boxes = []
        used = set()
        for p in panels:
            title = f"panel {p.get('id')} {p.get('title')!r}"
            g = p.get("gridPos") or {}
            if not all(isinstance(g.get(k), int) for k in "hwxy") or g["x"] + g["w"] > 24:
                fail(where, f"{title}: gridPos must have integer h, w, x, y within 24 columns")
            else:
                for other, o in boxes:
                    if g["x"] < o["x"] + o["w"] and o["x"] < g["x"] + g["w"] and g["y"] < o["y"] + o["h"] and o["y"] < g["y"] + g["h"]:
                        fail(where, f"{title} overlaps {other}")
                boxes.append((title, g))
            if p.get("type") == "row":
                continue
            targets = p.get("targets") or []
            if not targets:
                fail(where, f"{title}: no query")
            sources = [p.get("datasource")] + [t.get("datasource") for t in targets]
            for ds in sources:
                if not isinstance(ds, dict) or ds.get("uid") != "${DS_PROMETHEUS}":
                    fail(where, f"{title}: datasource must be {{'uid': '${{DS_PROMETHEUS}}'}}, not {ds!r}")
            for t in targets:
                expr = t.get("expr") or ""
                names, labels = promql_names(expr)
                known = [n for n in names if n in metrics]
                for n in sorted(names - set(known)):
                    fail(where, f"{title}: {n} is no metric that coordinator/src/metrics.rs or worker/src/metrics.rs registers ({expr})")
                if not known and not names - set(known):
                    fail(where, f"{title}: query names no metric ({expr!r})")
                have = set().union(*(metrics[n] for n in known)) if known else set()
                for label in sorted(labels - have):
                    if known:
                        fail(where, f"{title}: label {label!r} is on none of {sorted(known)} ({expr})")
                used |= set(known)
        base = {re.sub(r"_(bucket|sum|count)$", "", n) if n.endswith(("_bucket", "_sum", "_count")) and n.rsplit("_", 1)[0] + "_bucket" in metrics else n for n in metrics}
        shown = {re.sub(r"_(bucket|sum|count)$", "", n) if n.rsplit("_", 1)[0] + "_bucket" in metrics else n for n in used}
        missing = sorted(base - shown)
        print(f"  {where}: {len(panels)} panels, {len(shown)} of the {len(base)} registered metrics shown"
              + (f" (not shown: {', '.join(missing)})" if missing else ""))


def main():
    print("deploy/k8s:")
    check_k8s()
    print("deploy/grafana:")
    check_grafana()
    if failures:
        print(f"\n{len(failures)} failure(s):", file=sys.stderr)
        for f in failures:
            print(f"  FAIL {f}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
