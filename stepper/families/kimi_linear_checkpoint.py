"""A Kimi Linear checkpoint in either layout of its dense layers' MLP: the published one
(`model.layers.N.mlp.{gate,up,down}_proj.weight`) or the one transformers' save_pretrained writes
(`model.layers.N.block_sparse_moe.{gate,up,down}_proj.weight`: its conversion mapping renames every
`.block_sparse_moe.` to `.mlp.` on load and back on save, the dense layers' too). The checkpoint's
own names say which: its config's `dense_mlp` is set to match, so the checks, the run and every
message name the tensors as the files do. A checkpoint holding neither is refused as missing the
published names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from stepper.config import load_config
from stepper.weights import remote
from stepper.weights.checkpoint import Checkpoint

SAVED = "block_sparse_moe."  # transformers' save_pretrained's name of the dense layers' MLP


def open_checkpoint(where: str | Path, read: Callable[[dict[str, Any], str], Any]) -> Checkpoint:
    """The checkpoint (a folder, or a remote one), its config.json read by `read` (Kimi Linear's
    parse), its config's dense_mlp the layout its names hold."""
    read_config = partial(load_config, read=read)
    if isinstance(where, str) and remote.is_remote(where):
        ckpt = remote.open_remote(where, read_config=read_config)
    else:
        ckpt = Checkpoint(where, read_config)
    if holds_saved_layout(ckpt):
        ckpt.config = dataclasses.replace(ckpt.config, dense_mlp=SAVED)
    return ckpt


def holds_saved_layout(ckpt: Checkpoint) -> bool:
    """Whether a dense layer's gate_proj is stored under block_sparse_moe. and none under mlp."""
    cfg = ckpt.config
    dense = [layer for layer in range(cfg.num_hidden_layers) if not cfg.is_moe_layer(layer)]
    held = {prefix: any(f"model.layers.{layer}.{prefix}gate_proj.weight" in ckpt.weight_map for layer in dense)
            for prefix in (cfg.dense_mlp, SAVED)}
    return held[SAVED] and not held[cfg.dense_mlp]
