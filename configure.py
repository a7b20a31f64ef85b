"""Writes .bazelrc so Bazel builds the op library against the installed TensorFlow.

  python configure.py && bazel build //ops:_lease_ops.so
  python configure.py --bazel4 --output FILE    # Bazel 4.2.3 (scripts/bazel_check.sh)

Paths and flags come from tf.sysconfig, as in tensorflow/custom-op's configure.sh.
"""
from __future__ import annotations

import argparse
import pathlib
import re

import tensorflow as tf

ROOT = pathlib.Path(__file__).resolve().parent


def bazelrc_lines(enable_workspace: bool = True) -> list[str]:
    """The .bazelrc lines. `--enable_workspace` lets Bazel 8 read WORKSPACE; older Bazel
    (Debian's 4.2.3, scripts/bazel_check.sh) rejects it: enable_workspace=False there."""
    compile_flags = tf.sysconfig.get_compile_flags()
    link_flags = tf.sysconfig.get_link_flags()
    header_dir = next(f[2:] for f in compile_flags if f.startswith("-I"))
    lib_dir = next(f[2:] for f in link_flags if f.startswith("-L"))
    lib_name = next(re.sub(r"^-l:?", "", f) for f in link_flags if f.startswith("-l"))
    if not lib_name.startswith("lib"):
        lib_name = f"lib{lib_name}.so"
    lines = ["common --enable_workspace"] if enable_workspace else []
    lines += [f'build --action_env TF_HEADER_DIR="{header_dir}"',
             f'build --action_env TF_SHARED_LIBRARY_DIR="{lib_dir}"',
             f'build --action_env TF_SHARED_LIBRARY_NAME="{lib_name}"']
    lines += [f"build --cxxopt={flag}" for flag in compile_flags if not flag.startswith("-I")]
    lines += ["build -c opt"]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=pathlib.Path, default=ROOT / ".bazelrc")
    parser.add_argument("--bazel4", action="store_true",
                        help="for Bazel before 7, e.g. Debian's bazel-bootstrap 4.2.3: "
                             "no --enable_workspace, which it rejects")
    args = parser.parse_args()
    path = args.output
    path.write_text("\n".join(bazelrc_lines(enable_workspace=not args.bazel4)) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
