"""Analytics: detectors, correlation, root-cause ranking and incidents over the telemetry tables."""
