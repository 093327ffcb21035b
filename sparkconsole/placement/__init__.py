"""Where models go and whether they fit, against each node's unified memory: the memory estimate (estimate.py,
modelinfo.py), the node's budget (budget.py), and the placement built on them (fit.py, slots.py, render.py,
recovery.py, bars.py). Headless, below launch/: launch/, the collector and the console use it."""
