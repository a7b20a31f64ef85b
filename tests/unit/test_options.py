"""CrossoverStrategy's option groups: each checks itself, combinations that would be dropped
are refused, the strategy takes few arguments, and the runtime's modules import no circle."""
from __future__ import annotations

import ast
import inspect
import logging
import pathlib

import pytest

import crossover_tf
from crossover_tf import options
from crossover_tf.options import (CommunicationOptions, DeviceOptions, LeaseOptions,
                                  LinkTurnOptions)

RUNTIME = pathlib.Path(crossover_tf.__file__).parent


def test_strategy_takes_at_most_five_arguments_all_but_group_by_keyword():
    params = [p for p in inspect.signature(crossover_tf.CrossoverStrategy).parameters.values()]
    assert len(params) <= 5, [p.name for p in params]
    assert [p.name for p in params if p.kind is not p.KEYWORD_ONLY] == ["group"]


@pytest.mark.parametrize("memory", ["growth", "all", 512])
def test_device_memory_is_one_choice(memory):
    device = DeviceOptions(memory=memory)
    assert device.memory_growth == (memory == "growth")
    assert device.memory_limit_mb == (memory if isinstance(memory, int) else None)


@pytest.mark.parametrize("memory", ["lots", 0, -5, True, 1.5])
def test_device_memory_refuses_what_it_cannot_mean(memory):
    with pytest.raises(ValueError, match="memory"):
        DeviceOptions(memory=memory)


def test_device_key_follows_the_lease_name_rule():
    with pytest.raises(ValueError, match="device key"):
        DeviceOptions(device_key="gpu 0")


@pytest.mark.parametrize("jobs", [0, 65, True, 2.0])
def test_group_job_count_is_checked(jobs):
    with pytest.raises(ValueError, match="jobs"):
        LeaseOptions(jobs=jobs)


def test_reservation_belongs_to_a_primary_only():
    assert LeaseOptions(priority="primary").step_end_reserve_s == options.DEFAULT_PRIMARY_RESERVE_S
    assert LeaseOptions(priority="primary", primary_reserve_s=0.2).step_end_reserve_s == 0.2
    assert LeaseOptions(priority="secondary").step_end_reserve_s == 0.0
    for priority in ("normal", "secondary"):  # it used to be dropped without a word
        with pytest.raises(ValueError, match="primary_reserve_s.*ignored"):
            LeaseOptions(priority=priority, primary_reserve_s=0.1)
    with pytest.raises(ValueError, match="reservation"):
        LeaseOptions(priority="primary", primary_reserve_s=11.0)


@pytest.mark.parametrize("kwargs, match", [
    ({"join_timeout_s": 0}, "join_timeout_s"), ({"join_timeout_s": float("inf")},
                                                "join_timeout_s"),
    ({"timeout_s": -1.0}, "timeout"), ({"priority": "urgent"}, "priority")])
def test_lease_options_check_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LeaseOptions(**kwargs)


def test_link_turn_options_and_their_combination():
    with pytest.raises(ValueError, match="position"):
        LinkTurnOptions(position=-1)
    with pytest.raises(ValueError, match="timeout"):
        LinkTurnOptions(position=0, wait_s=0)
    turn = LinkTurnOptions(position=1)
    options.check_combination("g", LeaseOptions(jobs=2), turn)  # fine
    with pytest.raises(ValueError, match="need a group"):
        options.check_combination("", LeaseOptions(), turn)
    with pytest.raises(ValueError, match="position in"):  # the group's count, one number
        options.check_combination("g", LeaseOptions(jobs=1), turn)
    with pytest.raises(ValueError, match="priority"):
        options.check_combination("g", LeaseOptions(priority="primary"), turn)


def test_communication_options_check_placement():
    with pytest.raises(ValueError, match="allreduce_on must be one of"):
        CommunicationOptions(allreduce_on="gpu")
    # Horovod: NCCL next to the gradients
    CommunicationOptions(backend="horovod", allreduce_on="device")


@pytest.mark.parametrize("env, backend", [
    ({}, "tensorflow"),  # started alone: the job's one rank
    ({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]}}'}, "tensorflow"),  # launch, TFJob
    ({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2"}, "tensorflow"),  # a Slurm step
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "SLURM_PROCID": "1"}, "tensorflow"),  # srun --mpi=pmi2
    ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}, "horovod"),  # horovodrun --gloo
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "TF_CONFIG": "{}"}, "horovod"),  # a leftover
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, "horovod"),  # Open MPI's mpirun
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, "horovod"),  # MPICH's or Intel MPI's mpirun
])
def test_auto_backend_is_horovod_in_a_rank_horovodrun_started_and_tensorflow_elsewhere(
        env, backend):
    """Issue 51: "auto" is the default; it picks by what started the rank, and a backend named
    stays named wherever it runs."""
    assert CommunicationOptions().backend == "auto"
    assert options.resolve_backend("auto", env)[0] == backend
    assert CommunicationOptions().resolved_backend(env) == backend
    for named in options.BACKENDS:
        assert CommunicationOptions(backend=named).resolved_backend(env) == named


def test_auto_backend_reads_the_variables_horovodrun_really_sets():
    """What horovodrun --gloo puts in a rank's environment, from its own code."""
    pytest.importorskip("horovod")
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
    for slot in get_host_assignments(parse_hosts("localhost:2"), 2):
        env = {**create_run_env_vars("127.0.0.1", ["lo"], 12345), **create_slot_env_vars(slot)}
        assert options.resolve_backend("auto", env)[0] == "horovod", env


def test_what_auto_picked_is_logged_and_a_named_backend_is_not(caplog):
    from crossover_tf._communication import chosen_backend
    caplog.set_level(logging.INFO, logger="absl")
    assert chosen_backend(CommunicationOptions(), {"HOROVOD_RANK": "0"}) == "horovod"
    assert "backend 'auto' picked horovod (HOROVOD_RANK is set" in caplog.text
    caplog.clear()
    assert chosen_backend(CommunicationOptions(backend="tensorflow"),
                          {"HOROVOD_RANK": "0"}) == "tensorflow"
    assert "picked" not in caplog.text


@pytest.mark.parametrize("kwargs, match", [
    ({"compression": object()}, "compression is Horovod's; name backend='horovod'"),
    ({"allreduce_on": "device"}, "needs backend='horovod'; name backend='horovod'"),
    ({"init_horovod": False}, "init_horovod is Horovod's; name backend='horovod'"),
    ({"cluster_resolver": object()}, "cluster_resolver is for backend='tensorflow'; name"),
])
def test_auto_backend_needs_the_backend_named_with_a_setting_of_one_backend(kwargs, match):
    """Under "auto" such a setting would be dropped wherever auto picks the other library."""
    with pytest.raises(ValueError, match=match):
        CommunicationOptions(**kwargs)


def test_communication_options_refuse_what_the_tensorflow_backend_would_ignore():
    with pytest.raises(ValueError, match="allreduce_on='device' needs backend='horovod'"):
        CommunicationOptions(backend="tensorflow", allreduce_on="device")
    with pytest.raises(ValueError, match="init_horovod is Horovod's"):
        CommunicationOptions(backend="tensorflow", init_horovod=False)
    CommunicationOptions(backend="tensorflow", allreduce_on="host")  # what it does anyway


@pytest.mark.parametrize("micro_batches", [0, -1, 1.5, True, "2", None])
def test_micro_batches_are_whole_numbers(micro_batches):
    with pytest.raises(ValueError, match="micro_batches must be a whole number >= 1"):
        options.validate_micro_batches(micro_batches)
    options.validate_micro_batches(3)


def test_options_are_frozen():
    with pytest.raises(AttributeError):
        LeaseOptions().jobs = 3  # type: ignore[misc]


def test_strategy_refuses_flat_keywords_and_wrong_groups_before_starting_horovod():
    with pytest.raises(TypeError, match="lease_timeout_s"):
        crossover_tf.CrossoverStrategy("g", lease_timeout_s=60)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="takes a crossover_tf.LeaseOptions, got dict"):
        crossover_tf.CrossoverStrategy("g", lease={"jobs": 1})  # type: ignore[arg-type]


def _runtime_imports(path: pathlib.Path) -> set[str]:
    """The crossover_tf modules `path` imports, for type checking too: a module that needs
    another's types to be read is tied to it as much as one that runs it."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("crossover_tf."))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("crossover_tf"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if _module_path(candidate) else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _module_path(name: str) -> pathlib.Path | None:
    base = RUNTIME.parent.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(RUNTIME.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_circle_among_the_runtime_modules():
    """A package's __init__ importing its submodules is not a circle; a module importing a
    module that (through others) imports it back is."""
    graph = {_module_name(p): _runtime_imports(p) for p in RUNTIME.rglob("*.py")}
    for module, imports in graph.items():  # a module's own package is imported first anyway
        imports -= {parent for parent in graph if module.startswith(parent + ".")}
    assert "crossover_tf.strategy" not in graph["crossover_tf.callbacks"]

    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return path + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
        return None

    cycles = [c for c in map(cycle_from, sorted(graph)) if c]
    assert not cycles, cycles[0]


@pytest.mark.parametrize("host", ["node-7.cluster.local", "gpu node (a)", "x" * 200, ""])
def test_default_job_label_is_a_valid_lease_label(host):
    from crossover_tf._setup.bring_up import default_job_label
    from crossover_tf.lease import validate_job
    label = default_job_label({"host": host, "pid": 4242})
    assert validate_job(label) == label and label.endswith(":4242")


def test_job_label_is_checked_with_the_lease_rule():
    assert LeaseOptions(job="A").job == "A"
    with pytest.raises(ValueError, match="job"):
        LeaseOptions(job="job A/1")


@pytest.mark.parametrize("kwargs", [{"compression": object()}, {"allreduce_on": "device"},
                                    {"init_horovod": False}])
def test_auto_under_horovodrun_takes_horovods_settings(kwargs, monkeypatch):
    """A Horovod script ported as it was (issue 60: its compression under horovodrun was
    refused although "auto" resolves to Horovod there): in a rank horovodrun started, "auto"
    is Horovod, so its settings are used, never dropped; outside it they are still refused."""
    monkeypatch.setenv("HOROVOD_RANK", "0")
    CommunicationOptions(**kwargs)
    monkeypatch.delenv("HOROVOD_RANK")
    with pytest.raises(ValueError, match="name backend='horovod'"):
        CommunicationOptions(**kwargs)


def test_the_group_comes_from_crossover_group_where_none_is_named():
    """A launcher or recipe puts a script's jobs in a group without a flag of the script's own
    (issue 60: no environment convention); a name in code, "" included, wins."""
    assert options.resolve_group(None, {}) == ""
    assert options.resolve_group(None, {"CROSSOVER_GROUP": "pair0"}) == "pair0"
    assert options.resolve_group("", {"CROSSOVER_GROUP": "pair0"}) == ""
    assert options.resolve_group("mine", {"CROSSOVER_GROUP": "pair0"}) == "mine"
    with pytest.raises(ValueError, match=r"\$CROSSOVER_GROUP"):
        options.resolve_group(None, {"CROSSOVER_GROUP": "bad name!"})
