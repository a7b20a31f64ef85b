"""How a test worker writes what it saw: JSON per rank, replaced whole (a reader never sees half
a file). No TensorFlow here: workers import it before choosing which Keras to load."""
from __future__ import annotations

import json
import os
from typing import Any


def write_rank_result(out: str, rank: int, result: dict[str, Any]) -> None:
    """Writes result to out with RANK in its file name replaced by rank."""
    folder, name = os.path.split(out)
    path = os.path.join(folder, name.replace("RANK", str(rank)))
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
