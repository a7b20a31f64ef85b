"""Running a comparison: its settings, calibration, scenarios, trials and summaries."""
