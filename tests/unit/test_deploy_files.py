"""The deployment recipes (deploy/) as files: they parse, and say and set what matters.

Docker and Kubernetes cannot run on the test machine: their files are checked here as far as
that allows (PyYAML, which Horovod requires, parses them), and
tests/system/test_deploy_namespaces.py runs the sharing they set up. The Slurm scripts also run
for real (tests/system/test_deploy_slurm.py); here they are syntax-checked with `bash -n`.
"""
from __future__ import annotations

import json
import os
import pathlib
import shlex
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

yaml = pytest.importorskip("yaml", reason="PyYAML (a Horovod dependency) parses the recipes")

DEPLOY = REPO_ROOT / "deploy"
COMPOSE = DEPLOY / "docker" / "compose.yaml"
K8S_DRA = DEPLOY / "kubernetes" / "pods-dra-shared-claim.yaml"
K8S_TIME_SLICING = DEPLOY / "kubernetes" / "pods-time-slicing.yaml"
SLURM_JOB = DEPLOY / "slurm" / "crossover_job.sbatch"
SLURM_STEPS = DEPLOY / "slurm" / "crossover_steps.sbatch"
K8S_TFJOBS = DEPLOY / "kubernetes" / "tfjobs-shared-gpu.yaml"
K8S_TRAINJOBS = DEPLOY / "kubernetes" / "trainjobs-shared-gpu.yaml"
SLURM_TENSORFLOW = DEPLOY / "slurm" / "crossover_tensorflow.sbatch"
RECIPES = [COMPOSE, K8S_DRA, K8S_TIME_SLICING, K8S_TFJOBS, K8S_TRAINJOBS, SLURM_JOB,
           SLURM_STEPS, SLURM_TENSORFLOW]
PRIVATE_DIRS = ("/tmp", "/dev/shm")  # private per container / per job_container/tmpfs job


EXAMPLE_JOB = ["python", "-m", "crossover_tf.examples.fit_synthetic"]  # what the image installs


def job_flags(command: list[str]) -> dict[str, str]:
    """--name=value flags of the example job's command line."""
    assert command[:3] == EXAMPLE_JOB, command
    flags = {}
    for arg in command[3:]:
        assert arg.startswith("--") and "=" in arg, arg
        name, _, value = arg[2:].partition("=")
        flags[name] = value
    return flags


def check_pair(commands: list[list[str]]) -> None:
    """Two jobs of one group, each declaring a group of two, with flags the example job has."""
    from crossover_tf.examples import fit_synthetic
    flags = [job_flags(c) for c in commands]
    assert len(flags) == 2
    for f in flags:
        assert set(f) <= set(fit_synthetic.FLAG_NAMES), set(f) - set(fit_synthetic.FLAG_NAMES)
        assert f.get("group_jobs") == "2", f
        assert float(f.get("join_timeout_s", "0")) > 0, f
    assert flags[0]["group"] == flags[1]["group"] != "", flags
    assert flags[0]["job"] != flags[1]["job"], flags


def outside_private_dirs(path: str) -> bool:
    return not any(path == d or path.startswith(d + "/") for d in PRIVATE_DIRS)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_each_recipe_says_what_breaks_and_how_to_check(path: pathlib.Path) -> None:
    head = path.read_text().split("\n\n")[0] if path.suffix != ".sbatch" else \
        path.read_text().split("#SBATCH")[0]
    assert "WHAT BREAKS WITHOUT" in head, path
    assert "python -m crossover_tf.lease status" in head, path
    if path.suffix == ".yaml":
        assert "CANNOT RUN HERE" in head, path


def test_compose_services_share_one_lease_volume_group_and_gpu() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert len(services) == 2, services
    lease_dirs, mounts, gpus = set(), set(), set()
    for name, service in services.items():
        lease_dir = service["environment"]["CROSSOVER_LEASE_DIR"]
        assert outside_private_dirs(lease_dir), (name, lease_dir)
        lease_dirs.add(lease_dir)
        volume = [v.split(":")[0] for v in service["volumes"] if v.split(":")[1] == lease_dir]
        assert volume, f"{name}: nothing mounted at CROSSOVER_LEASE_DIR={lease_dir}"
        mounts.add(volume[0])
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"], device
        assert len(device["device_ids"]) == 1 and "count" not in device, device
        gpus.add(tuple(device["device_ids"]))
    assert len(lease_dirs) == len(mounts) == len(gpus) == 1, (lease_dirs, mounts, gpus)
    (volume,) = mounts
    assert volume in compose["volumes"], "the lease volume is a named volume both services use"
    assert compose["volumes"][volume]["driver_opts"]["type"] == "tmpfs"  # local, not NFS
    check_pair([s["command"] for s in services.values()])


def _pods(path: pathlib.Path) -> tuple[list[dict], list[dict]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return [d for d in docs if d["kind"] == "Pod"], [d for d in docs if d["kind"] != "Pod"]


def _check_pods_share_lease_dir(pods: list[dict]) -> None:
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    host_paths, groups, commands = set(), set(), []
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}  # not valueFrom ones
        lease_dir = env["CROSSOVER_LEASE_DIR"]
        assert outside_private_dirs(lease_dir), lease_dir
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == lease_dir]
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
        # the admin's directory (3770 of the jobs' group): kubelet's DirectoryOrCreate would
        # make one of root's, 0755, that the non-root jobs cannot write
        assert volume["hostPath"]["type"] == "Directory", volume
        host_paths.add(volume["hostPath"]["path"])
        # group mode: the jobs (and the exporter) share the lease through the directory's group
        assert env.get("CROSSOVER_LEASE_SHARED_GROUP") == "1", env
        groups.add(tuple(pod["spec"]["securityContext"]["supplementalGroups"]))
        commands.append(container["command"])
        assert not pod["spec"].get("hostIPC"), "the recipe shares a directory, not the IPC"
    assert len(host_paths) == 1 and len(groups) == 1, (host_paths, groups)
    check_pair(commands)


def test_kubernetes_dra_pods_share_one_claim_and_one_host_lease_dir() -> None:
    pods, others = _pods(K8S_DRA)
    _check_pods_share_lease_dir(pods)
    (claim,) = [d for d in others if d["kind"] == "ResourceClaim"]
    assert claim["apiVersion"].startswith("resource.k8s.io/"), claim["apiVersion"]
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com", request
    assert request["exactly"].get("count", 1) == 1, request
    for pod in pods:
        (ref,) = pod["spec"]["resourceClaims"]
        assert ref["resourceClaimName"] == claim["metadata"]["name"], ref  # not a template
        (container,) = pod["spec"]["containers"]
        assert [c["name"] for c in container["resources"]["claims"]] == [ref["name"]]


def test_kubernetes_time_slicing_pods_pin_one_node_and_one_replica_each() -> None:
    pods, others = _pods(K8S_TIME_SLICING)
    _check_pods_share_lease_dir(pods)
    (config_map,) = [d for d in others if d["kind"] == "ConfigMap"]
    (plugin_config,) = config_map["data"].values()
    (resource,) = yaml.safe_load(plugin_config)["sharing"]["timeSlicing"]["resources"]
    assert resource["name"] == "nvidia.com/gpu" and resource["replicas"] >= 2, resource
    nodes = {pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] for pod in pods}
    assert len(nodes) == 1, nodes
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_tfjobs_share_one_claim_and_lease_dir_and_use_tensorflow_collectives() -> None:
    """Issue 33's Kubeflow recipe: the operator writes TF_CONFIG; the jobs must choose the
    tensorflow backend, and share one GPU (one claim) and one host lease directory."""
    docs = [d for d in yaml.safe_load_all(K8S_TFJOBS.read_text()) if d]
    jobs = [d for d in docs if d["kind"] == "TFJob"]
    (claim,) = [d for d in docs if d["kind"] == "ResourceClaim"]
    assert len(jobs) == 2 and all(j["apiVersion"] == "kubeflow.org/v1" for j in jobs)
    pods = []
    for job in jobs:
        (kind,) = job["spec"]["tfReplicaSpecs"]
        replicas = job["spec"]["tfReplicaSpecs"][kind]
        assert kind == "Worker" and replicas["replicas"] == 1, replicas
        template = replicas["template"]
        (ref,) = template["spec"]["resourceClaims"]
        assert ref["resourceClaimName"] == claim["metadata"]["name"], ref
        (container,) = template["spec"]["containers"]
        assert container["name"] == "tensorflow"  # the container the operator gives TF_CONFIG
        assert "--backend=tensorflow" in container["command"], container["command"]
        assert [c["name"] for c in container["resources"]["claims"]] == [ref["name"]]
        pods.append({"metadata": job["metadata"], **template})
    _check_pods_share_lease_dir(pods)


def test_tfjobs_admit_only_their_own_ranks_to_their_ports() -> None:
    """TensorFlow's server runs graphs for whoever reaches it (issue 48): each TFJob has a
    NetworkPolicy that selects its pods and admits ingress from those pods alone."""
    docs = [d for d in yaml.safe_load_all(K8S_TFJOBS.read_text()) if d]
    jobs = [d["metadata"]["name"] for d in docs if d["kind"] == "TFJob"]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    label = "training.kubeflow.org/job-name"
    guarded = {}
    for policy in policies:
        spec = policy["spec"]
        job = spec["podSelector"]["matchLabels"][label]
        assert spec["policyTypes"] == ["Ingress"], spec
        (rule,) = spec["ingress"]
        assert [f["podSelector"]["matchLabels"] for f in rule["from"]] == [{label: job}], rule
        guarded[job] = policy["metadata"]["name"]
    assert sorted(guarded) == sorted(jobs), (guarded, jobs)


# Kubeflow Trainer v2 (issue 51 item 7): TrainJobs on a plain runtime, TF_CONFIG from JobSet.
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
ML_POLICY_SOURCES = {"torch", "mpi", "jax", "xgboost", "flux"}  # Trainer's MLPolicySource


def _trainjobs() -> tuple[list[dict], dict, dict, list[dict]]:
    """The TrainJobs, their one plain TrainingRuntime, the claim, and the other documents."""
    docs = [d for d in yaml.safe_load_all(K8S_TRAINJOBS.read_text()) if d]
    jobs = [d for d in docs if d["kind"] == "TrainJob"]
    (runtime,) = [d for d in docs if d["kind"] == "TrainingRuntime"]
    (claim,) = [d for d in docs if d["kind"] == "ResourceClaim"]
    return jobs, runtime, claim, docs


def _trainer_pod(runtime: dict) -> tuple[dict, dict]:
    """The runtime's trainer pod template and its "node" container (what Trainer's plugins set
    args and env in: the replicated job labelled trainjob-ancestor-step=trainer)."""
    (rjob,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] == "node", rjob["name"]
    labels = rjob["template"]["metadata"]["labels"]
    assert labels["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer", labels
    pod = rjob["template"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["name"] == "node", container["name"]
    return pod, container


def test_trainjobs_on_a_plain_runtime_share_one_claim_and_lease_dir() -> None:
    """Issue 51 item 7: two TrainJobs (Trainer v2) on one plain TrainingRuntime (no framework
    policy: PlainML), one node each, --backend=tensorflow, sharing one GPU (one claim in the
    runtime's pod template) and one host lease directory, as the TFJob recipe's pair does."""
    jobs, runtime, claim, _ = _trainjobs()
    assert len(jobs) == 2 and all(j["apiVersion"] == TRAINER_API for j in jobs), jobs
    assert runtime["apiVersion"] == TRAINER_API, runtime["apiVersion"]
    policy = runtime["spec"]["mlPolicy"]
    assert not set(policy) & ML_POLICY_SOURCES and set(policy) <= {"numNodes"}, policy
    pod, container = _trainer_pod(runtime)
    (ref,) = pod["spec"]["resourceClaims"]
    assert ref["resourceClaimName"] == claim["metadata"]["name"], ref  # shared, not a template
    assert [c["name"] for c in container["resources"]["claims"]] == [ref["name"]]
    assert pod["spec"]["restartPolicy"] == "Never", pod["spec"]
    pods = []
    for job in jobs:
        assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org",
                                             "kind": "TrainingRuntime",
                                             "name": runtime["metadata"]["name"]}, job["spec"]
        trainer = job["spec"]["trainer"]
        assert trainer["numNodes"] == 1, trainer   # one rank per job (see the file's header)
        assert "command" not in trainer, "the runtime's entrypoint must stay the command"
        assert "--backend=tensorflow" in trainer["args"], trainer["args"]
        env = {e["name"]: e["value"] for e in trainer["env"]}
        assert env["CROSSOVER_NUM_NODES"] == str(trainer["numNodes"]), env
        # the pod Trainer makes: the runtime's, with the TrainJob's args and env
        merged = {**container, "command": trainer["args"],
                  "env": container["env"] + trainer["env"]}
        pods.append({"metadata": job["metadata"],
                     "spec": {**pod["spec"], "containers": [merged]}})
    _check_pods_share_lease_dir(pods)


def _run_entrypoint(container: dict, jobset: str, index: int, nodes: int
                    ) -> subprocess.CompletedProcess:
    """The runtime's entrypoint as pod `index` of a TrainJob `jobset` of `nodes` pods gets it:
    the downward-API labels JobSet sets, JOB_COMPLETION_INDEX (an Indexed Job's), the
    TrainJob's CROSSOVER_NUM_NODES; its command prints the TF_CONFIG it is given."""
    labels = {JOBSET_NAME: jobset, "jobset.sigs.k8s.io/replicatedjob-name": "node",
              "jobset.sigs.k8s.io/job-index": "0"}
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(PYTHONPATH=str(REPO_ROOT), JOB_COMPLETION_INDEX=str(index),
               CROSSOVER_NUM_NODES=str(nodes))
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            assert path.startswith("metadata.labels['") and path.endswith("']"), path
            env[var["name"]] = labels[path[len("metadata.labels['"):-2]]
    python, *rest = container["command"]
    assert python == "python", container["command"]
    show = [sys.executable, "-c", "import os; print('TF_CONFIG=' + os.environ['TF_CONFIG'])"]
    return subprocess.run([sys.executable, *rest, *show], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("nodes", [1, 3])
def test_trainjob_entrypoint_writes_each_pods_tf_config_from_the_jobs_pods(nodes: int) -> None:
    """The entrypoint, run as each pod of a TrainJob would run it: every pod is a worker at
    JobSet's stable name <trainjob>-node-0-<i>.<trainjob> (Trainer's own torch and JAX plugins
    address pod 0 so), this pod worker JOB_COMPLETION_INDEX; a pod beyond CROSSOVER_NUM_NODES
    stops, saying so."""
    _, runtime, _, _ = _trainjobs()
    _, container = _trainer_pod(runtime)
    port = {e["name"]: e.get("value") for e in container["env"]}["CROSSOVER_TF_PORT"]
    expected = [f"crossover-tj-a-node-0-{i}.crossover-tj-a:{port}" for i in range(nodes)]
    for index in range(nodes):
        done = _run_entrypoint(container, "crossover-tj-a", index, nodes)
        assert done.returncode == 0, done.stderr
        (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("TF_CONFIG=")]
        config = json.loads(line.partition("=")[2])
        assert config == {"cluster": {"worker": expected},
                          "task": {"type": "worker", "index": index}}, config
    beyond = _run_entrypoint(container, "crossover-tj-a", nodes, nodes)
    assert beyond.returncode != 0 and "CROSSOVER_NUM_NODES" in beyond.stderr, beyond


def test_trainjobs_admit_only_their_own_ranks_to_their_ports() -> None:
    """As the TFJobs' (issue 48): each TrainJob has a NetworkPolicy that selects its pods (the
    label JobSet puts on them: the JobSet is named after the TrainJob) and admits ingress from
    those pods alone."""
    jobs, _, _, docs = _trainjobs()
    guarded = {}
    for policy in [d for d in docs if d["kind"] == "NetworkPolicy"]:
        spec = policy["spec"]
        job = spec["podSelector"]["matchLabels"][JOBSET_NAME]
        assert spec["policyTypes"] == ["Ingress"], spec
        (rule,) = spec["ingress"]
        assert [f["podSelector"]["matchLabels"] for f in rule["from"]] == [{JOBSET_NAME: job}]
        guarded[job] = policy["metadata"]["name"]
    assert sorted(guarded) == sorted(j["metadata"]["name"] for j in jobs), guarded


def test_slurm_tensorflow_script_runs_both_jobs_over_every_task_with_overlap() -> None:
    checked = subprocess.run(["bash", "-n", str(SLURM_TENSORFLOW)], capture_output=True,
                             text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    text = SLURM_TENSORFLOW.read_text()
    assert any(ln.startswith("#SBATCH --mem=") for ln in text.splitlines())
    srun = [shlex.split(ln.strip().rstrip("&")) for ln in text.splitlines()
            if ln.strip().startswith("srun ")]
    assert len(srun) == 2 and all("--overlap" in s for s in srun), srun
    assert all('--ntasks="$ntasks"' in ln for ln in text.splitlines()
               if ln.strip().startswith("srun ")), srun
    assert "--backend=tensorflow" in text.split("#SBATCH")[0]


@pytest.mark.parametrize("path", [SLURM_JOB, SLURM_STEPS], ids=lambda p: p.name)
def test_slurm_scripts_parse_and_ask_for_memory(path: pathlib.Path) -> None:
    checked = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True,
                             timeout=30)
    assert checked.returncode == 0, checked.stderr
    directives = [line.split(None, 1)[1] for line in path.read_text().splitlines()
                  if line.startswith("#SBATCH")]
    # CR_CORE_MEMORY gives a job without --mem the node's whole memory: the peer would queue.
    assert any(d.startswith("--mem=") for d in directives), directives
    assert "--nodes=1" in directives, directives


def test_slurm_job_script_defaults_to_a_lease_dir_outside_the_private_dirs() -> None:
    text = SLURM_JOB.read_text()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("export CROSSOVER_LEASE_DIR=")]
    default = line.split(":-", 1)[1].rstrip("}")
    assert outside_private_dirs(default), default
    for private in PRIVATE_DIRS:  # and the script refuses them
        assert f"{private}/*" in text


def test_slurm_steps_script_starts_both_steps_with_overlap() -> None:
    srun = [shlex.split(ln.strip().rstrip("&")) for ln in SLURM_STEPS.read_text().splitlines()
            if ln.strip().startswith("srun ")]
    assert len(srun) == 2, srun
    assert all("--overlap" in s for s in srun), srun
    assert {s[-1] for s in srun} == {"$CROSSOVER_COMMAND_A", "$CROSSOVER_COMMAND_B"}, srun
