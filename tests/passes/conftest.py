"""Pass tests: the property suite picks its own hypothesis profile per property (minfer-ci unless told)."""
