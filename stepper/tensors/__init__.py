"""The tensors of a run and their figures: what a tensor is (tensor), one too large to hold made a
tile at a time (tiled) or a chunk of positions at a time (chunked), and the exact statistics gathered
a batch of values at a time (statistics)."""
