"""A study: its file's schema, the validated spec, names, a model's shapes."""
