"""How a config is measured: every evaluator returns the same Outcome."""
