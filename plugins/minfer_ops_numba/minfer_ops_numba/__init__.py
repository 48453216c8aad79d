"""minfer-ops-numba: numba-compiled kernels that override minfer's hot numpy kernels by priority."""
