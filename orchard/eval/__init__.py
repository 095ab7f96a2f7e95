"""Evaluation: metrics over graded episodes and the runner that produces them (any task family)."""
