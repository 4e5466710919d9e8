"""OTLP/HTTP: decoding into Arrow and the receiver routes."""
