"""minfer-passes: graph optimization passes."""
