"""Applications: each module wires data, a model and the shared trainer into `qkv` commands."""
