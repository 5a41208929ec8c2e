"""`stepper tree`: every named tensor of a layer in execution order, grouped by the block that
computes it, with its shape for a config. The block names are also the debugger's breadcrumbs."""

from __future__ import annotations

from rich.text import Text
from rich.tree import Tree

from stepper import catalog
from stepper.config import Config
from stepper.untrusted import shown

BLOCKS = {
    "model": "model",
    "norm": "norm",
    "residual": "residual stream",
    "attention": "latent attention",
    "kda": "delta attention",
    "router": "MoE router",
    "moe": "MoE experts",
    "mlp": "FFN",
}


def layer_tree(cat: catalog.Catalog, cfg: Config, layer: int, attn: str) -> Tree:
    kind = "MoE" if cfg.is_moe_layer(layer) else "dense"
    same = [i for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i) == cfg.is_moe_layer(layer)]
    span = f"layers {same[0]}..{same[-1]}" if len(same) > 1 else f"layer {same[0]}"
    root = Tree(Text(f"{shown(cfg.name)}: {span} ({kind}), {attn} attention", style="bold"))
    branch, current = root, None
    for entry in cat.layer_sequence(cfg, layer, attn):
        block = BLOCKS.get(entry["block"], entry["block"])
        if block != current:  # consecutive tensors of one block share a branch, in execution order
            branch, current = root.add(Text(block, style="magenta")), block
        dims = ", ".join(d if (size := cat.expected_size(d, cfg)) is None else f"{size} {cat.raw['dims'][d]['label']}"
                         for d in entry["dims"])
        row = Text(entry["name"], style="bold cyan")
        row.append(f"  [{dims}]", style="yellow")
        row.append(f"  {entry['description']}")
        branch.add(row)
    return root
