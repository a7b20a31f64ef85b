"""Writes .bazelrc so Bazel builds the op library against the installed TensorFlow.

  python configure.py && bazel build //ops:_lease_ops.so

Paths and flags come from tf.sysconfig, as in tensorflow/custom-op's configure.sh.
"""
from __future__ import annotations

import pathlib
import re

import tensorflow as tf

ROOT = pathlib.Path(__file__).resolve().parent


def bazelrc_lines() -> list[str]:
    compile_flags = tf.sysconfig.get_compile_flags()
    link_flags = tf.sysconfig.get_link_flags()
    header_dir = next(f[2:] for f in compile_flags if f.startswith("-I"))
    lib_dir = next(f[2:] for f in link_flags if f.startswith("-L"))
    lib_name = next(re.sub(r"^-l:?", "", f) for f in link_flags if f.startswith("-l"))
    if not lib_name.startswith("lib"):
        lib_name = f"lib{lib_name}.so"
    lines = ["common --enable_workspace",
             f'build --action_env TF_HEADER_DIR="{header_dir}"',
             f'build --action_env TF_SHARED_LIBRARY_DIR="{lib_dir}"',
             f'build --action_env TF_SHARED_LIBRARY_NAME="{lib_name}"']
    lines += [f"build --cxxopt={flag}" for flag in compile_flags if not flag.startswith("-I")]
    lines += ["build -c opt"]
    return lines


def main() -> None:
    path = ROOT / ".bazelrc"
    path.write_text("\n".join(bazelrc_lines()) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
