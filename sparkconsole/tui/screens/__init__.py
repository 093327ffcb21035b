"""Console screens: dashboard, recipes, bench, logs, plus the help and confirmation modals."""
