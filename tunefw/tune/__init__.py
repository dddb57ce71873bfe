"""The search: the sweep driver, its pipeline, recorder and confirmation, the
Optuna searches and the worker pools."""
