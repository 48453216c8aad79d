"""minfer-ops-basic: elementwise, math, tensor-manipulation and reduction operators."""
