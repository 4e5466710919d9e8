"""The LLM agent and chat-ops (issue P8). Nothing here yet.

Note: the PyPI project openai-agents also installs a top-level ``agents`` module; aiops does not
depend on it. If that clash ever matters, the folder stays and the import package is renamed.
"""
