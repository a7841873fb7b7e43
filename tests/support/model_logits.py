"""Reads edgetrain's logits for a model, its weights and some examples, as the test program
edgetrain-model-logits (tests/support/model_logits.cc) prints them: a line `reference` or
`xnnpack` opens each backend's block, then one line of logits per example."""
import subprocess

import numpy as np


def edgetrain_logits(program, model, weights, data, count):
    """{'reference': array, 'xnnpack': array} of `program` (edgetrain-model-logits)."""
    run = subprocess.run([program, model, weights, data, str(count)], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"edgetrain-model-logits: exit {run.returncode}: {run.stderr}")
    blocks, name = {}, None
    for line in run.stdout.splitlines():
        if line in ("reference", "xnnpack"):
            name, blocks[line] = line, []
        else:
            blocks[name].append([float(v) for v in line.split()])
    return {k: np.array(v, dtype=np.float64) for k, v in blocks.items()}
