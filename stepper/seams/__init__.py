"""The seams between the model and what watches or changes it: the emit seam each tensor passes
through (trace), the exercise seam a lesson's function replaces stepper's through (swap), and
patches that replace tensors as they pass (patching)."""
