"""minfer-ops-conv: convolution, pooling, normalization and spatial operators."""
