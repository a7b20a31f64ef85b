"""The planner is its own package: a scheduler can import it without TensorFlow."""
from __future__ import annotations

import json
import subprocess
import sys


def test_planner_imports_without_tensorflow(child_env):
    code = ("import json, sys, crossover_tf_planner\n"
            "crossover_tf_planner.analytical.predict_pair(\n"
            "    crossover_tf_planner.JobProfile('a', compute_s=0.05, comm_s=0.05),\n"
            "    crossover_tf_planner.JobProfile('b', compute_s=0.05, comm_s=0.05), samples=0)\n"
            "print(json.dumps(sorted(m for m in sys.modules\n"
            "                        if m.split('.')[0] in ('tensorflow', 'crossover_tf'))))\n")
    result = subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == []
