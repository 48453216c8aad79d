"""minfer-passes: graph optimization passes, minfer's fused ops (domain ``ai.minfer``) and their kernels.

Each pass lives in the module of its family (folding, elimination, fusion,
activation, algebra, layout, shapes, portable) whose docstring states the
pattern it matches and the condition under which it is exact.
"""
