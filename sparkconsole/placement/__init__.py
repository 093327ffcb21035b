"""Where models go and whether they fit: the memory estimate (estimate.py, modelinfo.py) and the placement
built on it."""
