"""Issue 63 item 3: every recipe in deploy/ runs from the image it describes.

The recipes once ran `python -m experiments.train`, which `pip install` never installs (only the
namespaced packages are), and named an image (`crossover_tf:latest`) that no file built. Here:
every file parses, the image recipe builds from files that exist, every `python -m MODULE` names
a module of the installed packages, no image floats on `:latest`, every pod runs as a non-root
user with resource requests, and the multi-rank Slurm recipe lays one rank out per node.
Docker and Kubernetes cannot run on the test machine; tests/system/test_deploy_slurm.py runs
the Slurm recipes.
"""
from __future__ import annotations

import functools
import pathlib
import re
import shlex
import subprocess
import tomllib
from collections.abc import Iterator

import pytest
import setuptools

from conftest import REPO_ROOT

yaml = pytest.importorskip("yaml", reason="PyYAML (a Horovod dependency) parses the recipes")

DEPLOY = REPO_ROOT / "deploy"
IMAGE_RECIPE = DEPLOY / "docker" / "Containerfile"
TF_BASE_IMAGE = "tensorflow/tensorflow:2.21.0"
YAML_FILES = sorted(DEPLOY.rglob("*.yaml"))
SHELL_FILES = sorted([*DEPLOY.rglob("*.sbatch"), *DEPLOY.rglob("*.sh")])
TEXT_FILES = sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.suffix != ".json")
K8S_JOB_RECIPES = sorted(p for p in (DEPLOY / "kubernetes").glob("*.yaml")
                         if "exporter" not in p.name)
PYTHON_M = re.compile(r"python3?\"?,?\s+\"?-m\"?,?\s+\"?([A-Za-z_][\w.]*)")
LATEST = re.compile(r"[\w./-]+:latest\b")


def _rel(path: pathlib.Path) -> str:
    return str(path.relative_to(REPO_ROOT))


@functools.cache
def _installed_packages() -> frozenset[str]:
    """The packages `pip install` puts in site-packages: setuptools' search with
    pyproject.toml's include list, as the build runs it."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    return frozenset(setuptools.find_packages(where=str(REPO_ROOT), include=include))


def _installed_module_path(module: str) -> pathlib.Path | None:
    """The file `python -m module` runs from an install, or None where pip installs none."""
    package = module if (REPO_ROOT / module.replace(".", "/")).is_dir() \
        else module.rpartition(".")[0]
    if package not in _installed_packages():
        return None
    base = REPO_ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__main__.py"):
        if candidate.is_file():
            return candidate
    return None


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load's loader, refusing a key given twice in one mapping: PyYAML keeps the last one
    silently, and so would kubectl (a `limits:` written twice loses the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value
                if k.tag != "tag:yaml.org,2002:merge"]   # `<<: *anchor` may be overridden
        twice = sorted({str(k) for k in keys if keys.count(k) > 1})
        if twice:
            raise yaml.constructor.ConstructorError(None, None, f"keys given twice: {twice}",
                                                    node.start_mark)
        return super().construct_mapping(node, deep=deep)


@pytest.mark.parametrize("path", YAML_FILES, ids=_rel)
def test_every_yaml_recipe_loads(path: pathlib.Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs, path
    assert len([d for d in yaml.load_all(path.read_text(), Loader=_UniqueKeyLoader)
                if d is not None]) == len(docs)


@pytest.mark.parametrize("path", SHELL_FILES, ids=_rel)
def test_every_shell_recipe_parses(path: pathlib.Path) -> None:
    checked = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True,
                             timeout=30)
    assert checked.returncode == 0, checked.stderr


def _instructions(text: str) -> Iterator[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Containerfile, continuation lines joined."""
    logical = re.sub(r"\\\n", " ", text)
    for line in logical.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            yield word.upper(), rest.strip()


def test_the_image_recipe_builds_from_the_repository_on_pinned_tensorflow() -> None:
    """The image the recipes run: TensorFlow's official image at a pinned tag, crossover_tf
    installed from the build context (the repository), the op compiled into a root-owned cache
    at build time, a non-root user."""
    assert IMAGE_RECIPE.is_file(), "no image recipe in deploy/"
    steps = list(_instructions(IMAGE_RECIPE.read_text()))
    args = dict(a.partition("=")[::2] for word, a in steps if word == "ARG" and "=" in a)
    assert args.get("TF_IMAGE") == TF_BASE_IMAGE, args
    assert [a for w, a in steps if w == "FROM"] == ["${TF_IMAGE}"], steps
    for word, rest in steps:
        if word in ("COPY", "ADD"):
            *sources, _ = [w for w in shlex.split(rest) if not w.startswith("--")]
            for source in sources:
                assert (REPO_ROOT / source).exists(), f"{word} {source}: not in the repository"
    env = " ".join(a for w, a in steps if w == "ENV")
    assert "CROSSOVER_CACHE=/opt/crossover_cache" in env, env
    runs = " ".join(a for w, a in steps if w == "RUN")
    assert "pip install" in runs and "lease.load_library()" in runs, runs
    (user,) = [a for w, a in steps if w == "USER"]
    assert user.split(":")[0].isdigit() and int(user.split(":")[0]) > 0, user  # runAsNonRoot


def _recipe_modules() -> list[tuple[str, str]]:
    return [(_rel(p), m) for p in TEXT_FILES for m in PYTHON_M.findall(p.read_text())]


def test_the_example_job_is_an_installed_package() -> None:
    assert "crossover_tf.examples" in _installed_packages(), sorted(_installed_packages())
    assert not {p for p in _installed_packages() if p.split(".")[0] in ("experiments", "models")}


def test_recipes_run_modules_that_pip_installs() -> None:
    """experiments/ is run from a checkout only: an image with crossover_tf installed has no
    experiments.train, so a recipe naming it fails at start."""
    found = _recipe_modules()
    assert any(m == "crossover_tf.examples.fit_synthetic" for _, m in found), found
    missing = [(path, m) for path, m in found if _installed_module_path(m) is None]
    assert not missing, missing


def test_the_planners_slurm_lines_run_an_installed_module() -> None:
    from crossover_tf_planner import launch_lines
    words = shlex.split(launch_lines.default_command("A"))
    assert words[:2] == ["python", "-m"], words
    assert _installed_module_path(words[2]) is not None, words


@pytest.mark.parametrize("path", TEXT_FILES, ids=_rel)
def test_no_recipe_floats_on_latest(path: pathlib.Path) -> None:
    assert not LATEST.findall(path.read_text()), LATEST.findall(path.read_text())


def _pod_specs(node: object) -> Iterator[dict]:
    """Every pod spec (a mapping with `containers`) anywhere in a Kubernetes document."""
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            yield node
        for value in node.values():
            yield from _pod_specs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _pod_specs(value)


def _k8s_docs() -> Iterator[tuple[str, dict]]:
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc


@pytest.mark.parametrize("name, doc", [pytest.param(*d, id=d[0]) for d in _k8s_docs()
                                       if list(_pod_specs(d[1]))])
def test_every_pod_runs_as_a_non_root_user_with_resource_requests(name: str,
                                                                  doc: dict) -> None:
    for spec in _pod_specs(doc):
        context = spec.get("securityContext", {})
        assert context.get("runAsNonRoot") is True, (name, context)
        assert isinstance(context.get("runAsUser"), int) and context["runAsUser"] > 0, name
        for container in spec["containers"]:
            requests = container.get("resources", {}).get("requests", {})
            assert {"cpu", "memory"} <= set(requests), (name, container["name"], requests)
            limits = container["resources"].get("limits", {})
            assert "memory" in limits, (name, container["name"], limits)
            image = container["image"]
            assert re.search(r":[\w.-]+$", image.rpartition("/")[2]), (name, image)
            assert not container.get("securityContext", {}).get("privileged"), name


@pytest.mark.parametrize("path", K8S_JOB_RECIPES, ids=lambda p: p.name)
def test_kubernetes_job_recipes_say_one_rank_per_job_and_why_hostpath_needs_privileged(
        path: pathlib.Path) -> None:
    """Kubernetes does not place rank r of two jobs on one device: each recipe says its jobs
    have one rank (multi-rank pairs: Slurm), and that Pod Security "baseline" refuses the
    hostPath the lease directory is."""
    head = path.read_text().split("\napiVersion:")[0]
    assert "ONE RANK PER JOB" in head, path
    assert "Pod Security" in head and "baseline" in head, path


def test_compose_runs_its_jobs_as_a_non_root_user() -> None:
    compose = yaml.safe_load((DEPLOY / "docker" / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        user = str(service.get("user", "0"))
        assert user.split(":")[0].isdigit() and int(user.split(":")[0]) > 0, (name, user)
        assert service["build"]["dockerfile"].endswith(IMAGE_RECIPE.name), service


def _directives(path: pathlib.Path) -> dict[str, str]:
    return dict(line.split(None, 1)[1].partition("=")[::2]
                for line in path.read_text().splitlines() if line.startswith("#SBATCH "))


@pytest.mark.parametrize("path", sorted(DEPLOY.glob("slurm/*.sbatch")), ids=lambda p: p.name)
def test_slurm_recipes_lay_out_nodes_and_tasks_and_bound_their_time(
        path: pathlib.Path) -> None:
    directives = _directives(path)
    assert "--time" in directives and "--nodes" in directives, directives
    if path.name == "crossover_tensorflow.sbatch":
        # one rank of each job per node (and its GPU): --ntasks alone may put two ranks of a
        # job on one one-GPU node
        assert directives.get("--ntasks-per-node") == "1", directives
        assert "--ntasks" not in directives, directives
