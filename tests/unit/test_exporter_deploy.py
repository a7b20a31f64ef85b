"""The exporter's deployment files: the Kubernetes DaemonSet and the Grafana dashboard.

No Kubernetes or Grafana here: the DaemonSet is parsed (PyYAML) and checked for what matters
(the exporter's command, its port equal to the containerPort and the scrape annotation, a
read-only mount of the crossover pods' host lease directory at --lease_dir, no privileges, a
group to read the segments with, no GPU). The dashboard is parsed and every PromQL expression
checked against the exporter's metric names (crossover_tf/node/exporter_metrics.py), its
labels and the dashboard's variables, and, where Debian's prometheus package brought promtool
(scripts/install_prometheus.sh), parsed by `promtool check rules` as recording rules.
"""
from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO_ROOT
from crossover_tf.node import exporter_metrics

yaml = pytest.importorskip("yaml", reason="PyYAML (a Horovod dependency) parses the recipes")

DEPLOY = REPO_ROOT / "deploy"
DAEMONSET = DEPLOY / "kubernetes" / "exporter-daemonset.yaml"
DASHBOARD = DEPLOY / "grafana" / "crossover-lease-dashboard.json"
JOB_PODS = sorted((DEPLOY / "kubernetes").glob("pods-*.yaml"))
EXPORTER_COMMAND = ["python", "-m", "crossover_tf.lease", "exporter"]

# A metric name of ours in a PromQL expression: not preceded by a name character.
METRIC_RE = re.compile(r"(?<![A-Za-z0-9_:])crossover_lease_[A-Za-z0-9_:]*")
# Labels that Prometheus adds to every scraped series, and the histogram's bucket label.
SCRAPE_LABELS = {"instance", "job", "le"}
KNOWN_LABELS = {label for m in exporter_metrics.METRICS for label in m.labels} | SCRAPE_LABELS
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}


# --- the DaemonSet ----------------------------------------------------------------------------

def daemonset() -> dict:
    docs = [d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d]
    (ds,) = docs
    assert ds["apiVersion"] == "apps/v1" and ds["kind"] == "DaemonSet", ds
    return ds


def command_flags(command: list[str]) -> dict[str, str]:
    """The --name value / --name=value flags after the exporter's command."""
    assert command[:4] == EXPORTER_COMMAND, command
    flags, args = {}, list(command[4:])
    while args:
        arg = args.pop(0)
        assert arg.startswith("--"), (arg, command)
        name, eq, value = arg[2:].partition("=")
        flags[name] = value if eq else args.pop(0)
    return flags


def exporter_container(ds: dict) -> dict:
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    return container


def test_daemonset_header_says_what_breaks_and_how_to_check() -> None:
    head = DAEMONSET.read_text().split("\napiVersion:")[0]
    for needed in ("WHAT BREAKS WITHOUT", "CANNOT RUN HERE", "CHECK IT WORKED",
                   "CROSSOVER_LEASE_SHARED_GROUP=1", "supplementalGroups", "readOnly",
                   "ServiceMonitor", "PodMonitor"):
        assert needed in head, needed


def test_daemonset_runs_the_exporter_on_its_metrics_port() -> None:
    ds = daemonset()
    template = ds["spec"]["template"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    container = exporter_container(ds)
    flags = command_flags(container["command"])
    assert "args" not in container, "the whole command line is `command`"
    (port,) = [p for p in container["ports"] if p["name"] == "metrics"]
    assert flags["port"] == str(port["containerPort"]), (flags, port)
    assert flags["address"] == "0.0.0.0", flags  # the pod's IP, where Prometheus scrapes
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true", annotations
    assert annotations["prometheus.io/port"] == str(port["containerPort"]), annotations
    for probe in ("livenessProbe", "readinessProbe"):  # TCP: /metrics needs the password
        assert container[probe]["tcpSocket"]["port"] in ("metrics", port["containerPort"])


def test_daemonset_mounts_the_jobs_host_lease_dir_read_only_at_lease_dir() -> None:
    ds = daemonset()
    spec = ds["spec"]["template"]["spec"]
    container = exporter_container(ds)
    lease_dir = command_flags(container["command"])["lease_dir"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == lease_dir]
    assert mount.get("readOnly") is True, mount
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    assert env.get("CROSSOVER_LEASE_DIR", lease_dir) == lease_dir, env
    # The same host directory the crossover pods share as their CROSSOVER_LEASE_DIR.
    job_host_dirs = set()
    assert JOB_PODS, "deploy/kubernetes/pods-*.yaml"
    for path in JOB_PODS:
        for pod in yaml.safe_load_all(path.read_text()):
            if not pod or pod["kind"] != "Pod":
                continue
            (job,) = pod["spec"]["containers"]
            job_dir = {e["name"]: e["value"] for e in job["env"]}["CROSSOVER_LEASE_DIR"]
            (job_mount,) = [m for m in job["volumeMounts"] if m["mountPath"] == job_dir]
            (job_volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == job_mount["name"]]
            job_host_dirs.add(job_volume["hostPath"]["path"])
    assert job_host_dirs == {volume["hostPath"]["path"]}, (job_host_dirs, volume)


def test_daemonset_has_no_privileges_and_no_gpu() -> None:
    ds = daemonset()
    spec = ds["spec"]["template"]["spec"]
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(host), host
    pod_security = spec["securityContext"]
    assert pod_security["runAsNonRoot"] is True and pod_security["runAsUser"] != 0, pod_security
    # Reads group-mode segments (0660 of the jobs' group) through a supplementary group.
    assert pod_security["supplementalGroups"], pod_security
    container = exporter_container(ds)
    security = container["securityContext"]
    assert security.get("privileged", False) is False, security
    assert security["allowPrivilegeEscalation"] is False, security
    assert security["readOnlyRootFilesystem"] is True, security
    assert security["capabilities"]["drop"] == ["ALL"], security
    assert not security["capabilities"].get("add"), security
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["CUDA_VISIBLE_DEVICES"] == "", env
    resources = json.dumps(container["resources"])
    assert "gpu" not in resources, resources
    assert container["resources"]["requests"], container["resources"]


def test_daemonset_flags_exist_in_the_exporter_command_line() -> None:
    """Every flag the DaemonSet passes is one the exporter's --help lists (skipped until the
    exporter subcommand exists)."""
    flags = command_flags(exporter_container(daemonset())["command"])
    result = subprocess.run([sys.executable, "-m", "crossover_tf.lease", "exporter", "--help"],
                            capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT),
                                 "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"})
    if result.returncode != 0 and "invalid choice: 'exporter'" in result.stderr:
        pytest.skip("python -m crossover_tf.lease has no exporter subcommand yet")
    assert result.returncode == 0, result.stderr
    for name in flags:
        assert f"--{name}" in result.stdout, (name, result.stdout)


# --- the dashboard ------------------------------------------------------------------------------

def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(board: dict) -> list[dict]:
    """Every panel, rows' collapsed panels included."""
    out = []
    for panel in board["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def panel_exprs(board: dict) -> list[tuple[str, str]]:
    """(where, expr) of every query panel's targets."""
    return [(f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"])
            for p in all_panels(board) if p["type"] != "row" for t in p["targets"]]


def variable_selectors(board: dict) -> list[tuple[str, str]]:
    """(where, series selector) of every label_values(...) template variable."""
    out = []
    for var in board["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
        assert match, (var["name"], query)
        out.append((f"variable {var['name']}", match.group(1)))
    return out


def unknown_metric_names(expr: str) -> set[str]:
    """The crossover_lease_* names in a PromQL expression that the exporter does not serve."""
    return set(METRIC_RE.findall(expr)) - exporter_metrics.SAMPLE_NAMES


def test_the_name_check_catches_a_typo() -> None:
    good = "sum by (crossover_job) (rate(crossover_lease_handoffs_total{group=~\"$g\"}[1m]))"
    assert unknown_metric_names(good) == set()
    assert unknown_metric_names(good.replace("handoffs", "handoff")) == {
        "crossover_lease_handoff_total"}
    assert unknown_metric_names("crossover_lease_wait_seconds_bucket") == set()
    assert unknown_metric_names("crossover_lease_wait_seconds") == {
        "crossover_lease_wait_seconds"}  # a histogram's samples are _bucket, _sum, _count
    assert unknown_metric_names("x_crossover_lease_members") == set()  # not our name


def test_dashboard_parses_with_a_prometheus_datasource_variable() -> None:
    board = dashboard()
    assert 36 <= board["schemaVersion"] <= 41, board["schemaVersion"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource", variables
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert {"group", "device"} <= set(variables), variables
    for name in ("group", "device"):
        assert variables[name]["query"]["query"].startswith("label_values("), variables[name]
    for panel in all_panels(board):
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]


def test_dashboard_panels_have_unique_ids_targets_and_no_overlap() -> None:
    panels = all_panels(dashboard())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), ids
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip() and target["refId"], (panel["title"], target)
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, (panel["title"], g)
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, (panel["title"], cells.get((x, y)))
                cells[x, y] = panel["title"]


def test_dashboard_queries_use_only_the_exporters_names_labels_and_variables() -> None:
    board = dashboard()
    variables = {v["name"] for v in board["templating"]["list"]}
    for where, expr in panel_exprs(board) + variable_selectors(board):
        names = set(METRIC_RE.findall(expr))
        assert names, f"{where}: no crossover_lease_ metric in {expr!r}"
        assert not unknown_metric_names(expr), (where, unknown_metric_names(expr), expr)
        for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
            labels = {label.strip() for label in clause.split(",") if label.strip()}
            assert labels <= KNOWN_LABELS, (where, labels - KNOWN_LABELS)
        for selector in re.findall(r"\{([^}]*)\}", expr):
            labels = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector))
            assert labels <= KNOWN_LABELS, (where, labels - KNOWN_LABELS)
        used = set(re.findall(r"\$\{?(\w+)", expr)) - GRAFANA_BUILTINS
        assert used <= variables, (where, used - variables)


def test_dashboard_has_the_panels_issue_35_asks_for() -> None:
    panels = [p for p in all_panels(dashboard()) if p["type"] != "row"]
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in panels}

    def panel_using(pattern: str) -> list[str]:
        return [title for title, expr in exprs.items() if re.search(pattern, expr)]

    assert panel_using(r"sum by \(crossover_job\) \(rate\(crossover_lease_device_hold_seconds_"
                       r"total\{[^}]*\}\[\$__rate_interval\]\)\)")
    (quantiles,) = panel_using(r"histogram_quantile\(0\.99, sum by \(le, crossover_job\) "
                               r"\(rate\(crossover_lease_wait_seconds_bucket")
    assert "histogram_quantile(0.5," in exprs[quantiles]
    for metric in ("handoffs_total", "link_turn_wait_seconds_total", "members", "queue_length",
                   "holder_age_seconds", "exporter_skipped_files"):
        assert panel_using(rf"crossover_lease_{metric}\b"), metric
    # Overlapping holds: a stat panel, green at 0, red from 1.
    (overlap,) = [p for p in panels
                  if "crossover_lease_overlapping_holds_total" in exprs[p["title"]]]
    assert overlap["type"] == "stat", overlap["type"]
    steps = overlap["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[0]["color"] == "green" and steps[0]["value"] is None, steps
    assert {"color": "red", "value": 1} in steps, steps
    assert "or vector(0)" in exprs[overlap["title"]]  # 0, not "No data", with no lease yet


def promql_for_promtool(expr: str) -> str:
    """The dashboard's expression as plain PromQL: Grafana's range variables as 1m, its
    template variables (all inside =~ matchers) as .*."""
    out = re.sub(r"\$\{?__(?:rate_)?interval\}?|\$\{?__range\}?", "1m", expr)
    out = re.sub(r"\$\{?\w+\}?", ".*", out)
    assert "$" not in out, out
    return out


def promtool_check(tmp_path: pathlib.Path, exprs: list[str]) -> subprocess.CompletedProcess:
    rules = {"groups": [{"name": "crossover_dashboard", "rules": [
        {"record": f"crossover_dashboard:expr{i}", "expr": expr}
        for i, expr in enumerate(exprs)]}]}
    path = tmp_path / f"rules{len(list(tmp_path.iterdir()))}.yml"
    path.write_text(json.dumps(rules, indent=2))  # JSON is YAML
    return subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)


def test_dashboard_expressions_parse_with_promtool(tmp_path: pathlib.Path) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not on PATH (Debian's prometheus package ships it: "
                    "scripts/install_prometheus.sh)")
    board = dashboard()
    exprs = [promql_for_promtool(e) for _, e in panel_exprs(board) + variable_selectors(board)]
    result = promtool_check(tmp_path, exprs)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
    assert f"{len(exprs)} rules found" in result.stdout, result.stdout
    # And promtool does refuse a broken expression: the check above checks something.
    broken = promtool_check(tmp_path, ["sum by (crossover_job) (rate(crossover_lease_acquires_"
                                       "total[1m])"])
    assert broken.returncode != 0, broken.stdout


RULES = DEPLOY / "prometheus" / "crossover-lease-rules.yaml"
RULES_TEST = DEPLOY / "prometheus" / "crossover-lease-rules.test.yaml"


def test_alert_rules_use_only_the_exporters_names() -> None:
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"]
             for rule in group["rules"]]
    assert {r["alert"] for r in rules} >= {"CrossoverLeaseHeldTooLong",
                                           "CrossoverLeaseOverlappingHolds"}
    for rule in rules:
        assert METRIC_RE.findall(rule["expr"]), rule
        assert not unknown_metric_names(rule["expr"]), rule


def test_alert_rules_check_and_pass_their_promtool_unit_tests(tmp_path: pathlib.Path) -> None:
    """`promtool test rules`: synthetic series in, the alerts that must fire (a 7-minute hold,
    an overlapping hold) and must not (short holds, no skipped files) out; and a rule whose
    threshold no longer matches its test fails, so the test checks something."""
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not on PATH (scripts/install_prometheus.sh)")
    checked = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0 and "SUCCESS: 3 rules found" in checked.stdout, checked
    tested = subprocess.run(["promtool", "test", "rules", RULES_TEST.name], cwd=RULES.parent,
                            capture_output=True, text=True, timeout=60)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    (tmp_path / RULES.name).write_text(RULES.read_text().replace(
        "(crossover_lease_holder_age_seconds) > 300", "(crossover_lease_holder_age_seconds) > 500"))
    (tmp_path / RULES_TEST.name).write_text(RULES_TEST.read_text())
    broken = subprocess.run(["promtool", "test", "rules", RULES_TEST.name], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert broken.returncode != 0, broken.stdout


def test_deploy_readme_points_to_the_exporter_files() -> None:
    text = (DEPLOY / "README.md").read_text()
    for needed in ("kubernetes/exporter-daemonset.yaml", "grafana/crossover-lease-dashboard.json",
                   "python -m crossover_tf.lease exporter"):
        assert needed in text, needed
