"""stepper as a library, end to end: run, look, patch, compare, and the notebook displays.

    python docs/api_example.py [OUT.html]

In a notebook (docs/notebook.ipynb) each displayed value (`run.show(...)`, `run.picture(...)`,
`d`) draws itself once as the terminal would, and a run displays a summary; this script writes
the same displays into one HTML page instead, so it runs anywhere (tests/unit/test_notebook.py
runs it). The questions it asks: what does
layer 1's router choose, what if expert 0 contributed nothing, and where does that change start?
"""

import sys
from pathlib import Path

import numpy as np

import stepper

# A run keeps every tensor by default (globs in keep= keep fewer)
run = stepper.run("tiny", ids=[17, 402, 999, 3], decode=1)
chosen = run["prefill.layers.1.mlp.gate.topk_idx"]  # [N tokens, k experts], best first
print(f"{len(run.names)} tensors; generated {run.generated}; layer 1 chose {chosen.tolist()}")
print(run.explain("topk_idx")["formula"])

# What if the expert most tokens chose contributed nothing?
expert = int(np.bincount(chosen.ravel()).argmax())
patched = stepper.run("tiny", ids=[17, 402, 999, 3], decode=1, patch=stepper.zero_expert(1, expert))
d = stepper.diff(run, patched)
print(f"zeroing expert {expert}: first difference {d.first.name}; "
      f"{d.count('differs')} of {len(d.rows)} tensors differ; generated {patched.generated}")

# What a notebook would display, one after another
displays = [run.show("prefill.layers.1.self_attn.compressed_kv"),
            run.picture("routing", "prefill.layers.1.mlp.gate.topk_idx"),
            run.picture("attention", "prefill.layers.1.self_attn.attn_weights"), d]
page = "\n".join(f"<section>{shown._repr_html_()}</section>" for shown in displays)
if len(sys.argv) > 1:
    Path(sys.argv[1]).write_text(f"<!DOCTYPE html><html><meta charset='utf-8'><body>{page}</body></html>\n",
                                 encoding="utf-8")
    print(f"wrote {sys.argv[1]}")
