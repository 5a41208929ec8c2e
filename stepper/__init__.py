"""stepper: a plain-NumPy, step-through interpreter of the Kimi K2 / DeepSeek-V3 transformer layer.

As a library (`stepper.api`, loaded on first use, so `import stepper` stays light):

    run = stepper.run("tiny", ids=[1, 2, 3], decode=1)
    run["prefill.layers.1.self_attn.compressed_kv"]   # a NumPy array (a LazyTensor if made when read)

`run`, `diff`, `load`, `LazyTensor`, the patch helpers (`zero_expert`, `zero_head`, `force_experts`,
`zero_router_bias`) and `StepperError` are documented in `stepper.api`; `dir(stepper)` lists them
(so a shell or notebook completes them) without loading it.
"""

from stepper.version import __version__

__all__ = ["Diff", "LazyTensor", "LongRunWarning", "Run", "StepperError", "__version__", "diff", "force_experts",
           "load", "run", "zero_expert", "zero_head", "zero_router_bias"]


def __getattr__(name: str):
    if name in __all__:  # __version__ is already here
        from stepper import api

        return getattr(api, name)
    raise AttributeError(f"module 'stepper' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
