"""Writing dispatch tables: from a study's winners (JSON, CSV, the C++ header) and
calibrated against measurements; recorded-sweep files; every output file written whole
(files.py)."""
