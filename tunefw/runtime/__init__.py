"""Serving tuned kernels: the dispatch table and its rules, the Dispatcher, the torch
op and patching."""
