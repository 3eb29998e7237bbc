"""The coordinator: runs the speculative loop against draft and target services."""
