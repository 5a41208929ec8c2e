"""docs/notebook.ipynb executed by a real Jupyter kernel, from a folder that is not the repository:
each call displays once (no display while a value is drawn, none twice), with the values and
names this process computes for the same runs."""

import html
import os
import re
from pathlib import Path

import nbclient
import nbformat
import numpy as np
import pytest

import stepper

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "docs" / "notebook.ipynb"
IDS = [17, 402, 999, 3]


def visible(page: str) -> str:
    """The text a browser shows of an exported <pre> block."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


@pytest.fixture(scope="module")
def cells(tmp_path_factory) -> dict[str, list[dict]]:
    """Each code cell's outputs by its id, the notebook run once in one kernel started in an empty
    folder, importing this checkout's stepper."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "the notebook is kept without outputs"
    nb.cells.append(nbformat.v4.new_code_cell(  # in two chunks, as a busy kernel may send one
        "import os\nprint(os.getcwd(), flush=True)\nprint(stepper.__file__)"))
    nb.cells[-1].id = "where"
    folder = tmp_path_factory.mktemp("elsewhere")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    # A stream the kernel sends in chunks is one block of text on the page: merged, as a notebook shows it.
    client = nbclient.NotebookClient(nb, timeout=300, startup_timeout=120, kernel_name="python3", coalesce_streams=True,
                                     resources={"metadata": {"path": str(folder)}})
    client.execute(env=env)
    outputs = {c.id: c.outputs for c in nb.cells if c.cell_type == "code"}
    assert outputs["where"][0]["text"].split("\n")[:2] == [str(folder), str(ROOT / "stepper" / "__init__.py")]
    return outputs


@pytest.fixture(scope="module")
def run():
    return stepper.run("tiny", ids=IDS, decode=1)


def the_value(outputs: list[dict]) -> dict:
    """The cell's one output, its value: no display before it, none after."""
    assert [o["output_type"] for o in outputs] == ["execute_result"], [o["output_type"] for o in outputs]
    assert "\x1b" not in outputs[0]["data"]["text/plain"]  # plain text, though the kernel sets FORCE_COLOR
    return outputs[0]["data"]


def test_a_run_displays_once_as_a_summary_of_its_steps_and_layers(cells, run):
    data = the_value(cells["run"])
    assert data["text/plain"] == repr(run) == "<stepper.Run tiny: 199 tensors kept of 199, prompt [17, 402, 999, 3], " \
                                              "generated [294]>"
    shown = visible(data["text/html"]).splitlines()
    assert shown[0] == repr(run) and len(shown) == 1 + 8 + 1  # the title, 2 steps x (model + 3 layers), the hint
    assert re.fullmatch(r"prefill · layer 1 \(MoE\) +35 kept  hidden_states, input_layernorm, self_attn\.q_a, .*…",
                        shown[3])
    assert shown[5] == "decode0 · model               5 kept  embed, rope_cos, rope_sin, norm, logits"
    assert len(data["text/html"]) < 10_000  # not every tensor's row (275 KB before)


def test_a_tensor_displays_its_row_once_with_its_values(cells, run):
    data = the_value(cells["show"])
    name = "prefill.layers.1.self_attn.compressed_kv"
    row = repr(run.show(name))
    assert data["text/plain"] == row and visible(data["text/html"]).strip() == row.strip()
    kv = run[name]
    assert row.startswith(f"{name}  [B=1 batch, T=4 positions, 128 kv latent]  float32")
    assert f"min {kv.min():.4g}  max {kv.max():.4g}" in row and f"corners {kv[0, 0, 0]:.4g}" in row


def test_the_pictures_display_once_as_drawn_here(cells, run):
    routing = the_value(cells["routing"])
    drawn = repr(run.picture("routing", "prefill.layers.1.mlp.gate.topk_idx"))
    assert routing["text/plain"] == drawn and visible(routing["text/html"]).strip() == drawn.strip()
    top = np.bincount(run["prefill.layers.1.mlp.gate.topk_idx"].ravel()).argmax()
    assert "experts used" in drawn and re.search(rf"\b{top}\b", drawn)
    attention = the_value(cells["attention"])
    drawn = repr(run.picture("attention", "prefill.layers.1.self_attn.attn_weights"))
    assert attention["text/plain"] == drawn and "head 0" in drawn and "prefill.layers.1.self_attn.attn_weights" in drawn


def test_a_patch_and_its_diff_display_once(cells, run):
    expert = int(np.bincount(run["prefill.layers.1.mlp.gate.topk_idx"].ravel()).argmax())
    patched = stepper.run("tiny", ids=IDS, decode=1, patch=stepper.zero_expert(1, expert))
    assert [(o["output_type"], o["name"], o["text"]) for o in cells["patch"]] == [
        ("stream", "stdout", f"expert {expert} zeroed: generated {run.generated} -> {patched.generated}\n")]
    data = the_value(cells["diff"])
    d = stepper.diff(run, patched)
    assert data["text/plain"] == repr(d) and d.first.name == "prefill.layers.1.mlp.gate.topk_weight"
    shown = visible(data["text/html"])
    assert "first difference: prefill.layers.1.mlp.gate.topk_weight" in shown and shown.count("first difference") == 1


def test_display_in_a_loop_displays_each_once(cells, run):
    assert [o["output_type"] for o in cells["display"]] == ["display_data", "display_data"]
    assert [o["data"]["text/plain"] for o in cells["display"]] == [
        repr(run.show(f"{step}.layers.1.mlp.gate.topk_idx")) for step in ("prefill", "decode0")]


def test_the_repository_fixtures_are_found_by_name_from_another_folder(cells):
    assert the_value(cells["fixtures"])["text/plain"] == "True"
