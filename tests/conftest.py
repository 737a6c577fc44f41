import os

os.environ.setdefault("MPLBACKEND", "agg")
