"""Small computed facts that lesson texts quote with `{fact.NAME(args)}`.

A fact is a named function of the lesson's run (its plan, the tensors emitted so far, the result
at the end) and of literal string arguments; it returns a number, a list or a short text (a
table). Lessons never run code of their own: a lesson names a fact, and only the facts below
exist. Arguments are literals: a preset name, a tensor scope like `layers.1` or
`decode0.layers.1`, an integer, a word.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from stepper import fp8
from stepper.config import Config
from stepper.errors import StepperError
from stepper.lessons.context import Context
from stepper.model.cache import cache_bytes_per_token
from stepper.model.rope import rope_inv_freq, yarn_correction_range, yarn_mscale
from stepper.model.router import max_per_group, route
from stepper.presets import PRESETS, V4_PRESETS
from stepper.seams.trace import Emitter, Recorder
from stepper.session import preset_config, run

FACTS: dict[str, Callable[..., Any]] = {}


def fact(func: Callable[..., Any]) -> Callable[..., Any]:
    FACTS[func.__name__] = func
    return func


def compute(name: str, ctx: Context, args: list[str]) -> Any:
    if name not in FACTS:
        raise StepperError(f"unknown fact '{name}' (facts: {', '.join(sorted(FACTS))})")
    try:
        return FACTS[name](ctx, *args)
    except TypeError as e:
        raise StepperError(f"fact.{name}({', '.join(args)}): {e}") from None


def config_of(ctx: Context, name: str | None) -> Config:
    if not name:
        return ctx.cfg
    if name not in PRESETS and name not in V4_PRESETS:
        raise StepperError(f"no preset '{name}' (presets: {', '.join([*PRESETS, *V4_PRESETS])})")
    return preset_config(name)


def integer(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise StepperError(f"{what} must be an integer, got '{text}'") from None


# ---------------------------------------------------------------------------------------------
# The cache


@fact
def cache_bytes(ctx: Context, path: str = "naive", model: str = "", itemsize: str = "4") -> int:
    """Bytes one layer caches per position: `naive` (per-head keys and values) or `latent`."""
    if path not in ("naive", "latent"):
        raise StepperError(f"fact.cache_bytes: path is naive or latent, got '{path}'")
    return cache_bytes_per_token(config_of(ctx, model), "naive" if path == "naive" else "absorb", int(itemsize))


@fact
def cache_floats(ctx: Context, path: str = "naive", model: str = "") -> int:
    """Numbers one layer caches (and reads back) per position."""
    return cache_bytes(ctx, path, model, "1")


@fact
def cache_ratio(ctx: Context, model: str = "") -> float:
    cfg = config_of(ctx, model)
    return cache_bytes_per_token(cfg, "naive") / cache_bytes_per_token(cfg, "absorb")


@fact
def cache_gb(ctx: Context, path: str, model: str, tokens: str, itemsize: str = "2") -> float:
    """The whole model's cache in GB (1e9 bytes) for `tokens` positions, all layers."""
    cfg = config_of(ctx, model)
    per = cache_bytes(ctx, path, model, itemsize)
    return per * cfg.num_hidden_layers * integer(tokens, "tokens") / 1e9


# ---------------------------------------------------------------------------------------------
# Rotary embedding and YaRN


@fact
def mscale(ctx: Context, model: str = "") -> float:
    """YaRN's attention scale factor mscale(factor, mscale_all_dim) (1.0 without YaRN)."""
    yarn = config_of(ctx, model).rope_scaling
    return 1.0 if yarn is None or not yarn.mscale_all_dim else yarn_mscale(yarn.factor, yarn.mscale_all_dim)


@fact
def mscale_squared(ctx: Context, model: str = "") -> float:
    return mscale(ctx, model) ** 2


@fact
def softmax_scale(ctx: Context, model: str = "") -> float:
    cfg = config_of(ctx, model)
    return cfg.qk_head_dim**-0.5 * mscale(ctx, model) ** 2


@fact
def yarn_range(ctx: Context, model: str = "") -> list[int]:
    cfg = config_of(ctx, model)
    if cfg.rope_scaling is None:
        raise StepperError(f"model {cfg.name} has no YaRN scaling")
    return list(yarn_correction_range(cfg.qk_rope_head_dim, cfg.rope_theta, cfg.rope_scaling))


@fact
def inv_freq(ctx: Context, model: str = "") -> np.ndarray:
    cfg = config_of(ctx, model)
    return rope_inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta, cfg.rope_scaling)


@fact
def inv_freq_plain(ctx: Context, model: str = "") -> np.ndarray:
    cfg = config_of(ctx, model)
    return rope_inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta, None)


@fact
def freq_divisor(ctx: Context, model: str = "") -> np.ndarray:
    """How much YaRN slowed each pair down: plain inv_freq / YaRN inv_freq (1 = kept, factor = interpolated)."""
    return np.round(inv_freq_plain(ctx, model) / inv_freq(ctx, model), 3)


@fact
def wavelengths(ctx: Context, model: str = "") -> np.ndarray:
    """Positions per full turn of each pair, 2*pi/inv_freq, before YaRN."""
    return np.round(2 * np.pi / inv_freq_plain(ctx, model), 1)


@fact
def kept_pairs(ctx: Context, model: str = "") -> list[int]:
    """The rotary pairs whose frequency YaRN leaves as it is."""
    return [int(i) for i in np.nonzero(inv_freq(ctx, model) == inv_freq_plain(ctx, model))[0]]


@fact
def plain_scale(ctx: Context, model: str = "") -> float:
    """qk_head_dim^-0.5: the softmax scale without YaRN's mscale^2."""
    return config_of(ctx, model).qk_head_dim ** -0.5


@fact
def softmax_scale_single(ctx: Context, model: str = "") -> float:
    """qk_head_dim^-0.5 * mscale (once, not squared): a common slip."""
    return plain_scale(ctx, model) * mscale(ctx, model)


@fact
def rope_pairs(ctx: Context, scope: str = "layers.0", head: str = "0", token: str = "0", rows: str = "8") -> str:
    """q_pe's interleaved pairs next to q_pe_rope's halves: the same pairs, rotated and regrouped."""
    q_pe = ctx.tensor(f"{scope}.self_attn.q_pe")
    q_rope = ctx.tensor(f"{scope}.self_attn.q_pe_rope")
    h, t = integer(head, "head"), integer(token, "token")
    x, y = q_pe[0, h, t], q_rope[0, h, t]  # [R]
    half = x.shape[-1] // 2
    position = ctx.spec.start_pos + t if not scope.startswith("decode") else None
    freqs = inv_freq(ctx)
    where = f" (position {position})" if position is not None else ""
    lines = [f"head {h}, token {t}{where}:",
             f"pair i of q_pe sits at [2i, 2i+1], of q_pe_rope at [i, i+{half}]",
             f"pair  q_pe[2i] [2i+1]   q_pe_rope[i] [i+{half}]  angle mod 2pi  length before, after"]
    for i in range(min(half, integer(rows, "rows"))):
        a, b = float(x[2 * i]), float(x[2 * i + 1])
        c, d = float(y[i]), float(y[i + half])
        angle = "" if position is None else f"{math.fmod(float(np.float32(position) * freqs[i]), 2 * math.pi):.4f}"
        lines.append(f"{i:4d}  {a:8.4f} {b:7.4f}   {c:8.4f} {d:8.4f}   {angle:>11}   {math.hypot(a, b):.4f}, "
                     f"{math.hypot(c, d):.4f}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Weights and FP8


@fact
def weight(ctx: Context, name: str) -> np.ndarray:
    """A weight as the model reads it: float32, FP8 dequantized."""
    return ctx.plan.weights.get(name)


def stored_fp8(ctx: Context, name: str):
    stored = ctx.plan.weights.stored(name)
    if stored.dtype != "F8_E4M3":
        raise StepperError(f"'{name}' is stored as {stored.dtype}, not FP8")
    return stored


@fact
def scale_grid(ctx: Context, name: str) -> list[int]:
    return list(np.shape(stored_fp8(ctx, name).scale_inv))


@fact
def block_size(ctx: Context, name: str, row: str, col: str) -> int:
    """How many weights share the scale of block (row, col), partial blocks included."""
    stored = stored_fp8(ctx, name)
    out_dim, in_dim = np.shape(stored.data)
    bo, bi = stored.block if hasattr(stored, "block") else fp8.BLOCK
    r, c = integer(row, "row"), integer(col, "col")
    return max(0, min(bo, out_dim - r * bo)) * max(0, min(bi, in_dim - c * bi))


@fact
def fp8_bits(ctx: Context, code: str) -> str:
    return fp8.fields(int(code, 0)).bits


@fact
def fp8_value(ctx: Context, code: str) -> float:
    return fp8.decode_bits(int(code, 0))


@fact
def fp8_row(ctx: Context, name: str, count: str = "4") -> str:
    """The first codes of a weight's row 0: byte, bits, e4m3 value, times the block's scale."""
    stored = stored_fp8(ctx, name)
    codes = fp8.as_codes(stored.data)
    scale = float(np.asarray(stored.scale_inv, dtype=np.float32)[0, 0])
    lines = [f"{name}, row 0:", f"its block (0, 0) has scale_inv {scale:.6g}",
             "  j   byte   s eeee mmm   e4m3 value   x scale_inv = weight"]
    for j in range(integer(count, "count")):
        f = fp8.fields(int(codes[0, j]))
        lines.append(f"{j:3d}   0x{f.code:02X}   {f.bits}   {f.value:10.5g}   "
                     f"{np.float32(f.value) * np.float32(scale):12.6g}")
    return "\n".join(lines)


@fact
def fp8_absmax(ctx: Context, name: str) -> float:
    """The largest |e4m3 value| among a weight's codes (before the scales)."""
    return float(np.nanmax(np.abs(fp8.decode(fp8.as_codes(stored_fp8(ctx, name).data)))))


# ---------------------------------------------------------------------------------------------
# Routing


def router(ctx: Context, scope: str) -> dict[str, np.ndarray]:
    names = ("scores", "scores_for_choice", "group_mask", "topk_idx", "topk_weight")
    out = {n: ctx.tensor(f"{scope}.mlp.gate.{n}") for n in names if f"{scope}.mlp.gate.{n}" in ctx.tensors}
    layer = int(scope.rsplit("layers.", 1)[1])
    out["bias"] = ctx.plan.weights.get(f"model.layers.{layer}.mlp.gate.e_score_correction_bias")
    return out


@fact
def group_size(ctx: Context) -> int:
    return ctx.cfg.n_routed_experts // ctx.cfg.n_group


def choose(values: np.ndarray, k: int) -> set[int]:
    return {int(i) for i in np.argsort(-values, kind="stable")[:k]}


def chosen_without_groups(ctx: Context, scope: str, token: int) -> set[int]:
    return choose(router(ctx, scope)["scores_for_choice"][token], ctx.cfg.num_experts_per_tok)


def kept_mask(ctx: Context, scope: str, token: int) -> np.ndarray:
    """[E] bool: the experts of the token's kept groups (from scores_for_choice, so any stop after it works)."""
    biased = router(ctx, scope)["scores_for_choice"][token]
    grouped = np.sort(biased.reshape(ctx.cfg.n_group, -1), axis=-1)
    group_scores = grouped[:, -1] + grouped[:, -2]
    kept = np.zeros(ctx.cfg.n_group, dtype=bool)
    kept[np.argsort(-group_scores, kind="stable")[: ctx.cfg.topk_group]] = True
    return np.repeat(kept, group_size(ctx))


def chosen_without_bias(ctx: Context, scope: str, token: int) -> set[int]:
    r = router(ctx, scope)
    return choose(np.where(kept_mask(ctx, scope, token), r["scores"][token], -np.inf), ctx.cfg.num_experts_per_tok)


def chosen(ctx: Context, scope: str, token: int) -> set[int]:
    """The experts the router chose (worked out the router's way before topk_idx is emitted)."""
    r = router(ctx, scope)
    if "topk_idx" in r:
        return {int(e) for e in r["topk_idx"][token]}
    biased = r["scores_for_choice"][token]
    return choose(np.where(kept_mask(ctx, scope, token), biased, -np.inf), ctx.cfg.num_experts_per_tok)


@fact
def telling_token(ctx: Context, scope: str = "layers.1") -> int:
    """A token whose choice the group limit changed (else the bias, else token 0)."""
    n = router(ctx, scope)["scores_for_choice"].shape[0]
    for test in (chosen_without_groups, chosen_without_bias):
        for t in range(n):
            if test(ctx, scope, t) != chosen(ctx, scope, t):
                return t
    return 0


def token_arg(ctx: Context, scope: str, token: str) -> int:
    return telling_token(ctx, scope) if token == "telling" else integer(token, "token")


@fact
def group_changes(ctx: Context, scope: str = "layers.1") -> int:
    """Tokens whose experts would differ without the group limit."""
    n = router(ctx, scope)["scores"].shape[0]
    return sum(chosen_without_groups(ctx, scope, t) != chosen(ctx, scope, t) for t in range(n))


@fact
def bias_changes(ctx: Context, scope: str = "layers.1") -> int:
    """Tokens whose experts would differ if the bias were not added (same groups kept)."""
    n = router(ctx, scope)["scores"].shape[0]
    return sum(chosen_without_bias(ctx, scope, t) != chosen(ctx, scope, t) for t in range(n))


@fact
def kept_groups(ctx: Context, scope: str = "layers.1", token: str = "0") -> list[int]:
    mask = ctx.tensor(f"{scope}.mlp.gate.group_mask")[token_arg(ctx, scope, token)]
    return [int(g) for g in np.nonzero(mask)[0]]


@fact
def group_scores(ctx: Context, scope: str = "layers.1", token: str = "0") -> list[float]:
    return [round(float(v), 4) for v in ctx.tensor(f"{scope}.mlp.gate.group_scores")[token_arg(ctx, scope, token)]]


@fact
def experts_per_token(ctx: Context, model: str = "") -> int:
    """Expert MLPs each token of a MoE layer runs: the routed top-k plus the shared experts."""
    cfg = config_of(ctx, model)
    return cfg.num_experts_per_tok + cfg.n_shared_experts


@fact
def experts(ctx: Context, scope: str = "layers.1", token: str = "0") -> list[int]:
    return sorted(chosen(ctx, scope, token_arg(ctx, scope, token)))


@fact
def routing_table(ctx: Context, scope: str = "layers.1", token: str = "0", rows: str = "8") -> str:
    """The best experts of one token by biased score, with their group, score and bias."""
    r = router(ctx, scope)
    t = token_arg(ctx, scope, token)
    biased = r["scores_for_choice"][t]
    order = np.argsort(-biased, kind="stable")[: integer(rows, "rows")]
    g = group_size(ctx)
    kept = set(np.nonzero(r["group_mask"][t])[0].tolist()) if "group_mask" in r else None
    lines = [f"token {t}: its {len(order)} best experts by scores_for_choice = score + bias",
             "expert  group  score    bias      score+bias"]
    for e in order:
        group = int(e) // g
        note = "" if kept is None or group in kept else "   (group dropped)"
        lines.append(f"{int(e):6d}  {group:5d}  {r['scores'][t, e]:.4f}  {r['bias'][e]:+.4f}   {biased[e]:.4f}{note}")
    return "\n".join(lines)


@fact
def routing_why(ctx: Context, scope: str = "layers.1", token: str = "0") -> str:
    """Why the learner's set of experts (ctx.answer) is not the chosen one, expert by expert."""
    r = router(ctx, scope)
    t = token_arg(ctx, scope, token)
    answer = set(ctx.answer or ())
    won = chosen(ctx, scope, t)
    k, g = ctx.cfg.num_experts_per_tok, group_size(ctx)
    kept = set(np.nonzero(r["group_mask"][t])[0].tolist()) if "group_mask" in r else set(range(ctx.cfg.n_group))
    rank = {int(e): i + 1 for i, e in enumerate(np.argsort(-r["scores_for_choice"][t], kind="stable"))}
    reasons = []
    for e in sorted(answer - won):
        if not 0 <= e < ctx.cfg.n_routed_experts:
            reasons.append(f"there is no expert {e} (experts are 0..{ctx.cfg.n_routed_experts - 1})")
        elif e // g not in kept:
            reasons.append(f"expert {e} is in group {e // g}, which was dropped: only groups {sorted(kept)} compete")
        else:
            reasons.append(f"expert {e} ranks {rank[e]} by score + bias among all experts, not in the top {k} of the "
                           "kept groups")
    if len(answer) != k:
        reasons.append(f"each token picks exactly {k} experts")
    right = len(answer & won)
    return f"{right} of {k} right. " + "; ".join(reasons)


@fact
def routed(ctx: Context, scope: str, token: str, rank: str, what: str) -> float | int:
    """A token's expert at `rank` (in topk_idx order once emitted, before that by score + bias):
    expert | group | score | bias | biased | weight."""
    r = router(ctx, scope)
    t, k = token_arg(ctx, scope, token), integer(rank, "rank")
    if "topk_idx" in r:
        e = int(r["topk_idx"][t, k])
    else:
        e = int(np.argsort(-r["scores_for_choice"][t], kind="stable")[k])
    values = {"expert": e, "group": e // group_size(ctx), "score": float(r["scores"][t, e]),
              "bias": float(r["bias"][e]), "biased": float(r["scores_for_choice"][t, e])}
    if "topk_weight" in r:
        values["weight"] = float(r["topk_weight"][t, k])
    if what not in values:
        raise StepperError(f"fact.routed: what is one of {', '.join(values)} here, got '{what}'")
    return values[what]


# ---------------------------------------------------------------------------------------------
# Other runs of the same lesson


_RERUNS: dict[Any, dict[str, np.ndarray]] = {}


def rerun(ctx: Context, **changes: Any) -> dict[str, np.ndarray]:
    """Every tensor of the lesson's run with some fields changed (kept for the next fact that asks)."""
    spec = dataclasses.replace(ctx.spec, **changes)
    key = (spec, id(ctx.plan.weights))
    if key not in _RERUNS:
        recorder = Recorder()
        run(spec, [recorder], ctx.plan.weights)
        _RERUNS.clear()  # keep one: a lesson asks about one other run
        _RERUNS[key] = recorder.tensors()
    return _RERUNS[key]


def max_difference(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| over the entries finite in both (masked -inf scores match each other)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    both = np.isfinite(a) & np.isfinite(b)
    return float(np.max(np.abs(a[both] - b[both]))) if both.any() else 0.0


@fact
def naive_diff(ctx: Context, name: str) -> float:
    """max |this run's tensor - the naive attention path's| (the same run with attn = naive)."""
    other = rerun(ctx, attn="naive")
    if name not in other:
        raise StepperError(f"fact.naive_diff: the naive run emits no '{name}'")
    return max_difference(ctx.tensor(name), other[name])


@fact
def uncached_diff(ctx: Context, name: str) -> float:
    """max |a decode step's tensor - the same position computed without a cache| (at the end of a run)."""
    if ctx.result is None:
        raise StepperError("fact.uncached_diff needs the whole run: use it in the outro")
    step = name.split(".", 1)[0]
    if not step.startswith("decode"):
        raise StepperError(f"fact.uncached_diff: '{name}' is not a decode step's tensor")
    k = int(step[len("decode"):])
    ids = tuple(ctx.result.prompt) + tuple(ctx.result.generated[: k + 1])
    other = rerun(ctx, ids=ids, decode=0, attn="naive")
    plain = name.split(".", 1)[1]
    mine = ctx.tensor(name)  # [B, 1, ...]: the one new position
    return max_difference(mine[:, -1], other[plain][:, -1])


@fact
def attended(ctx: Context, scope: str) -> int:
    """S, the positions a layer's attention covers at this step (from its scores)."""
    return int(ctx.tensor(f"{scope}.self_attn.attn_scores").shape[-1])


@fact
def uncached_length(ctx: Context, step: str) -> int:
    """How many tokens the uncached run of a decode step covers: the prompt plus the tokens fed so far."""
    if ctx.result is None:
        raise StepperError("fact.uncached_length needs the whole run: use it in the outro")
    return len(ctx.result.prompt) + int(step[len("decode"):]) + 1


@fact
def compare_rms(ctx: Context, a: str, b: str) -> str:
    """'larger', 'smaller' or 'about the same': the RMS of tensor a against tensor b."""
    ra = float(np.sqrt(np.mean(np.square(ctx.tensor(a).astype(np.float64)))))
    rb = float(np.sqrt(np.mean(np.square(ctx.tensor(b).astype(np.float64)))))
    if math.isclose(ra, rb, rel_tol=0.05):
        return "about the same"
    return "larger" if ra > rb else "smaller"


# ---------------------------------------------------------------------------------------------
# The three routers on the same logits (lesson three-routers)

ROUTERS = {  # router -> (scoring_func, topk_method, norm_topk_prob)
    "v3": ("sigmoid", "noaux_tc", True),  # the run's own, with its bias
    "v2": ("softmax", "group_limited_greedy", False),
    "v2-lite": ("softmax", "greedy", False),
}


def routed_by(ctx: Context, scope: str, name: str) -> np.ndarray:
    """topk_idx [N, k] the named router picks from the run's logits at `scope`, with the run's
    groups, k and bias (model.router on the logits, an identity gate)."""
    if name not in ROUTERS:
        raise StepperError(f"router is one of {', '.join(ROUTERS)}, got '{name}'")
    logits = ctx.tensor(f"{scope}.mlp.gate.logits")  # [N, E]
    scoring, method, norm = ROUTERS[name]
    cfg = dataclasses.replace(ctx.cfg, scoring_func=scoring, topk_method=method, norm_topk_prob=norm)
    bias = router(ctx, scope)["bias"] if method == "noaux_tc" else None
    identity = np.eye(logits.shape[1], dtype=np.float32)
    return route(logits, identity, bias, cfg, Emitter()).topk_idx


def router_token(ctx: Context, scope: str, token: str) -> int:
    """A token number, `telling` (fact.telling_token) or `contrast` (fact.contrast_token)."""
    return contrast_token(ctx, scope) if token == "contrast" else token_arg(ctx, scope, token)


@fact
def contrast_token(ctx: Context, scope: str = "layers.1") -> int:
    """A token for which V2's group rule keeps other groups than V3's (else fact.telling_token)."""
    n = ctx.tensor(f"{scope}.mlp.gate.logits").shape[0]
    return next((t for t in range(n) if v2_kept_groups(ctx, scope, str(t)) != v3_kept_groups(ctx, scope, str(t))),
                telling_token(ctx, scope))


@fact
def experts_by(ctx: Context, scope: str, token: str, name: str) -> list[int]:
    """The experts router `name` (v3, v2, v2-lite) picks for a token, in increasing order."""
    return sorted(int(e) for e in routed_by(ctx, scope, name)[router_token(ctx, scope, token)])


@fact
def routers_disagree(ctx: Context, scope: str, a: str, b: str) -> int:
    """Tokens for which routers a and b pick different sets of experts."""
    x, y = np.sort(routed_by(ctx, scope, a), axis=1), np.sort(routed_by(ctx, scope, b), axis=1)
    return int(np.any(x != y, axis=1).sum())


@fact
def softmax_group_max(ctx: Context, scope: str = "layers.1", token: str = "0") -> list[float]:
    """A token's group scores under DeepSeek-V2's rule: each group's best softmax score."""
    logits = ctx.tensor(f"{scope}.mlp.gate.logits")[router_token(ctx, scope, token)][None].astype(np.float64)
    p = np.exp(logits - logits.max())
    return [round(float(v), 4) for v in max_per_group(p / p.sum(), ctx.cfg.n_group)[0]]


@fact
def v2_kept_groups(ctx: Context, scope: str = "layers.1", token: str = "0") -> list[int]:
    """The groups DeepSeek-V2's rule keeps for a token: the topk_group with the best single expert."""
    best = np.array(softmax_group_max(ctx, scope, token))
    return sorted(int(g) for g in np.argsort(-best, kind="stable")[: ctx.cfg.topk_group])


@fact
def v3_kept_groups(ctx: Context, scope: str = "layers.1", token: str = "0") -> list[int]:
    """The groups V3's rule keeps for a token, from its group_scores (before group_mask is emitted)."""
    scores = np.array(v3_group_scores(ctx, scope, token))
    return sorted(int(g) for g in np.argsort(-scores, kind="stable")[: ctx.cfg.topk_group])


@fact
def v3_experts_v2_may_pick(ctx: Context, scope: str = "layers.1", token: str = "0") -> list[int]:
    """V3's experts for a token that lie in the groups V2's rule keeps: the only ones of them V2 could pick."""
    size, kept = group_size(ctx), v2_kept_groups(ctx, scope, token)
    return [e for e in experts_by(ctx, scope, token, "v3") if e // size in kept]


@fact
def v3_group_scores(ctx: Context, scope: str = "layers.1", token: str = "0") -> list[float]:
    """A token's group scores under V3's rule (the two best biased scores of each group, summed)."""
    return [round(float(v), 4) for v in ctx.tensor(f"{scope}.mlp.gate.group_scores")[router_token(ctx, scope, token)]]


@fact
def routers_table(ctx: Context, scope: str = "layers.1") -> str:
    """Each token's experts under the three routers, with a mark where they differ from V3's."""
    picks = {name: np.sort(routed_by(ctx, scope, name), axis=1) for name in ROUTERS}
    def cell(n: str, t: int) -> str:
        same = n == "v3" or np.array_equal(picks[n][t], picks["v3"][t])
        return " ".join(f"{e:2d}" for e in picks[n][t]) + ("" if same else " *")
    cells = [[cell(n, t) for n in ROUTERS] for t in range(picks["v3"].shape[0])]
    width = max(len("V2-Lite"), *(len(c) for row in cells for c in row))
    lines = ["token  " + "  ".join(f"{title:<{width}}" for title in ("V3", "V2", "V2-Lite")).rstrip()]
    lines += [f"{t:5d}  " + "  ".join(f"{c:<{width}}" for c in row).rstrip() for t, row in enumerate(cells)]
    return "\n".join(lines + ["V3: sigmoid + bias, groups by their two best; V2: softmax, groups by their best;",
                               "V2-Lite: softmax, no groups. * a different set from V3's"])


# ---------------------------------------------------------------------------------------------
# DeepSeek-V3.2's Lightning Indexer (lesson sparse-attention)


def index_tensor(ctx: Context, scope: str, name: str) -> np.ndarray:
    """Batch 0 of one of a layer's indexer tensors, e.g. index_scores [T, S]."""
    return ctx.tensor(f"{scope}.self_attn.indexer.{name}")[0]


@fact
def unpruned_tokens(ctx: Context, scope: str = "layers.0") -> int:
    """Tokens whose every past position survived the indexer (at most index_topk in their past)."""
    past = np.isfinite(index_tensor(ctx, scope, "index_scores")).sum(axis=-1)  # [T]
    kept = (index_tensor(ctx, scope, "topk_idx") >= 0).sum(axis=-1)  # [T]
    return int((kept == past).sum())


@fact
def self_dropped(ctx: Context, scope: str = "layers.0") -> list[int]:
    """The tokens of the step whose own position the indexer did not keep."""
    idx = index_tensor(ctx, scope, "topk_idx")  # [T, Ki]
    first = index_tensor(ctx, scope, "index_scores").shape[-1] - idx.shape[0]  # the step's first position in S
    return [t for t in range(idx.shape[0]) if first + t not in idx[t]]


@fact
def kept_positions(ctx: Context, scope: str = "layers.0", token: str = "-1") -> list[int]:
    """The positions (in S) a token of the step keeps, in increasing order."""
    row = index_tensor(ctx, scope, "topk_idx")[integer(token, "token")]
    return sorted(int(s) for s in row if s >= 0)


@fact
def recent_positions(ctx: Context, scope: str = "layers.0", token: str = "-1") -> list[int]:
    """The index_topk positions nearest a token (itself and the ones just before): a sliding window."""
    scores = index_tensor(ctx, scope, "index_scores")
    t = integer(token, "token") % scores.shape[0]
    newest = scores.shape[-1] - scores.shape[0] + t
    return list(range(max(0, newest + 1 - ctx.cfg.index_topk), newest + 1))


def indexer_config(ctx: Context, model: str) -> Config:
    cfg = config_of(ctx, model)
    if not cfg.has_indexer:
        raise StepperError(f"model {cfg.name} has no Lightning Indexer (no index_topk)")
    return cfg


@fact
def index_macs(ctx: Context, model: str = "") -> int:
    """Multiply-adds the indexer spends on one query-key pair: a dot product of index_head_dim per index head."""
    cfg = indexer_config(ctx, model)
    return cfg.index_n_heads * cfg.index_head_dim


@fact
def mla_macs(ctx: Context, model: str = "") -> int:
    """Multiply-adds absorbed MLA spends on one query-key pair it attends: per head, a score over
    the latent and the rope key (kv_lora_rank + qk_rope_head_dim) and a weighted sum of the latent."""
    cfg = config_of(ctx, model)
    return cfg.num_attention_heads * (2 * cfg.kv_lora_rank + cfg.qk_rope_head_dim)


@fact
def dense_macs(ctx: Context, model: str, keys: str) -> int:
    """One query's attention over `keys` positions without an indexer."""
    return mla_macs(ctx, model) * integer(keys, "keys")


@fact
def sparse_macs(ctx: Context, model: str, keys: str) -> int:
    """One query over `keys` positions with the indexer: it scores all of them, MLA attends index_topk."""
    s = integer(keys, "keys")
    return index_macs(ctx, model) * s + mla_macs(ctx, model) * min(s, indexer_config(ctx, model).index_topk)


@fact
def sparse_saving(ctx: Context, model: str, keys: str) -> float:
    """How many times less attention work one query does with the indexer than without, over `keys` positions."""
    return dense_macs(ctx, model, keys) / sparse_macs(ctx, model, keys)


@fact
def break_even(ctx: Context, model: str = "") -> float:
    """The number of positions above which the indexer saves more than it costs:
    index_macs * S + mla_macs * index_topk = mla_macs * S."""
    mla = mla_macs(ctx, model)
    return mla * indexer_config(ctx, model).index_topk / (mla - index_macs(ctx, model))


@fact
def read_saving(ctx: Context, model: str, keys: str) -> float:
    """How many times fewer cached numbers one query reads with the indexer: dense MLA reads every
    position's latent and rope key; sparse reads every index key and index_topk latents."""
    cfg, s = indexer_config(ctx, model), integer(keys, "keys")
    latent = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    return latent * s / (cfg.index_head_dim * s + latent * min(s, cfg.index_topk))


@fact
def index_cheaper(ctx: Context, model: str = "") -> float:
    """How many times less the indexer spends scoring a position than MLA attending to it."""
    return mla_macs(ctx, model) / index_macs(ctx, model)


@fact
def topk_fraction(ctx: Context, model: str, keys: str) -> float:
    """keys / index_topk: the saving if scoring the positions were free."""
    return integer(keys, "keys") / indexer_config(ctx, model).index_topk


@fact
def kept_why(ctx: Context, scope: str = "layers.0", token: str = "-1") -> str:
    """Why the learner's set of positions (ctx.answer) is not the one a token kept, position by position."""
    scores = index_tensor(ctx, scope, "index_scores")[integer(token, "token")]  # [S]
    past = int(np.isfinite(scores).sum())
    kept = set(kept_positions(ctx, scope, token))
    rank = {int(s): i + 1 for i, s in enumerate(np.argsort(-scores, kind="stable")[:past])}
    answer = set(ctx.answer or ())
    reasons = []
    for s in sorted(answer - kept):
        if s in rank:
            reasons.append(f"position {s} scores {scores[s]:.3f}, rank {rank[s]} of {past}")
        else:
            reasons.append(f"position {s} is not in its past (positions 0 to {past - 1})")
    reasons += [f"position {s} scores {scores[s]:.3f}, rank {rank[s]}: kept" for s in sorted(kept - answer)]
    if len(answer) != len(kept):
        reasons.append(f"it keeps exactly {len(kept)}")
    return f"{len(answer & kept)} of {len(kept)} right. " + "; ".join(reasons)


# ---------------------------------------------------------------------------------------------
# DeepSeek-V4's compressed attention and hyper-connections (lessons compressed-attention,
# hyper-connections)


@fact
def keys_seen(ctx: Context, scope: str = "layers.1", token: str = "-1") -> int:
    """The keys a token of the step attends in a V4 layer, read off the run: its scores that are
    not -inf (window slots and entries), the sink's column left out."""
    scores = ctx.tensor(f"{scope}.attn.scores")[0, 0, integer(token, "token"), :-1]  # [S_q]
    return int(np.isfinite(scores).sum())


@fact
def keys_per_token(ctx: Context, scope: str = "layers.1") -> list[int]:
    """keys_seen for every token of the step, the first first."""
    scores = ctx.tensor(f"{scope}.attn.scores")[0, 0, :, :-1]  # [T, S_q]
    return [int(n) for n in np.isfinite(scores).sum(axis=-1)]


@fact
def entries_seen(ctx: Context, scope: str = "layers.1", token: str = "-1") -> int:
    """The compressed entries a token of the step attends (its picks that are not -1)."""
    return int((ctx.tensor(f"{scope}.attn.chosen")[0, integer(token, "token")] >= 0).sum())


@fact
def recent_entries(ctx: Context, scope: str = "layers.1", token: str = "-1") -> list[int]:
    """The index_topk newest entries a token can see: what a window over the entries would keep."""
    visible = int(np.isfinite(ctx.tensor(f"{scope}.attn.indexer.scores")[0, integer(token, "token")]).sum())
    return list(range(max(0, visible - ctx.cfg.index_topk), visible))


@fact
def v4_keys(ctx: Context, model: str, layer: str, position: str) -> int:
    """The keys a query at `position` attends in a V4 layer, from the config alone: the window
    (its own position and the sliding_window - 1 before it), then the entries of the windows of m
    closed by then, (position + 1) // m, of which a CSA layer (m = 4) keeps at most index_topk."""
    dims = config_of(ctx, model).dims(integer(layer, "layer"))
    p = integer(position, "position")
    window = min(p + 1, dims.sliding_window)
    made = (p + 1) // dims.compress_ratio if dims.compress_ratio else 0
    return window + (min(made, dims.index_topk) if dims.has_indexer else made)


@fact
def comb_table(ctx: Context, name: str = "layers.0.hc_attn.comb", token: str = "0") -> str:
    """A token's stream-mixing matrix (comb or comb_softmax) with its row and column sums: row j
    says how much of stream j goes into each new stream k."""
    comb = ctx.tensor(name)[0, integer(token, "token")]  # [n, n]
    n = comb.shape[0]
    lines = ["        " + "".join(f"{'to ' + str(k):>8}" for k in range(n)) + f"{'sum':>8}"]
    lines += [f"from {j:<3}" + "".join(f"{v:8.4f}" for v in comb[j]) + f"{comb[j].sum():8.4f}" for j in range(n)]
    return "\n".join([*lines, "sum     " + "".join(f"{v:8.4f}" for v in comb.sum(axis=0))])
