"""stepper: a plain-NumPy, step-through interpreter of the Kimi K2 / DeepSeek-V3 transformer layer."""

__version__ = "0.1.0"
