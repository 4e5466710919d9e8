"""The LLM agent and chat-ops: intent, the deterministic investigation plan, tools,
narratives, incident memory, and the HTTP, Slack and CLI front ends.

Note: the PyPI project openai-agents also installs a top-level ``agents`` module; aiops does not
depend on it. If that clash ever matters, the folder stays and the import package is renamed.
"""
