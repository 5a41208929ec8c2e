"""`stepper tree`: every named tensor of a layer in execution order, grouped by the block that
computes it, with its shape for a config. The block names are also the debugger's breadcrumbs."""

from __future__ import annotations

from rich.text import Text
from rich.tree import Tree

from stepper import catalog
from stepper.config import Config
from stepper.session import takes
from stepper.untrusted import shown

BLOCKS = {
    "model": "model",
    "norm": "norm",
    "residual": "residual stream",
    "attention": "latent attention",
    "compressed_attention": "compressed attention",  # DeepSeek-V4's
    "kda": "delta attention",
    "router": "MoE router",
    "moe": "MoE experts",
    "mlp": "FFN",
}


def block_title(cfg: Config, layer: int | None, block: str) -> str:
    """A catalogue block's heading in a layer: the attention's output projection, shared with MLA,
    is the delta attention's in a Kimi Linear KDA layer."""
    if block == "attention" and layer is not None and getattr(cfg, "is_kda_layer", lambda i: False)(layer):
        block = "kda"
    return BLOCKS.get(block, block)


def layer_kind(cfg: Config, layer: int) -> str:
    """What sets a layer's tensors apart: MoE or dense, or what the config's class says (a
    `layer_label(layer)` method: DeepSeek-V4's attention kind and routing)."""
    own = getattr(cfg, "layer_label", None)
    return own(layer) if own is not None else "MoE" if cfg.is_moe_layer(layer) else "dense"


def layer_tree(cat: catalog.Catalog, cfg: Config, layer: int, attn: str) -> Tree:
    kind = layer_kind(cfg, layer)
    same = [i for i in range(cfg.num_hidden_layers) if layer_kind(cfg, i) == kind]
    span = f"layers {same[0]}..{same[-1]}" if len(same) > 1 else f"layer {same[0]}"
    kda = getattr(cfg, "is_kda_layer", lambda i: False)(layer)  # Kimi Linear's delta attention takes no --attn path
    path = f", {attn} attention" if takes(cfg, "attn") and not kda else ""  # DeepSeek-V4 has one attention path
    root = Tree(Text(f"{shown(cfg.name)}: {span} ({kind}){path}", style="bold"))
    branch, current = root, None
    for entry in cat.layer_sequence(cfg, layer, attn):
        block = block_title(cfg, layer, entry["block"])
        if block != current:  # consecutive tensors of one block share a branch, in execution order
            branch, current = root.add(Text(block, style="magenta")), block
        dims = ", ".join(d if (size := cat.expected_size(d, cfg, layer)) is None else
                         f"{size} {catalog.counted(cat.label(d, cfg, layer), size)}" for d in entry["dims"])
        row = Text(entry["name"], style="bold cyan")
        row.append(f"  [{dims}]", style="yellow")
        row.append(f"  {cat.description(entry['name'], cfg)}")
        branch.add(row)
    return root
