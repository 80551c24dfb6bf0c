"""The application around the model: the command line, result folders, reports, plots, sweeps, teaching aids."""
