"""A scripted OpenAI-compatible chat endpoint on loopback, standing in for a capable
tool-calling model (none runs on this machine): it asks for ``list_incidents`` first, then
answers with the incident id it was given. It checks the wire protocol and the agent's tool
loop, not a model's judgement."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import FastAPI, Request

__all__ = ["scripted_app"]


def _reply(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {"id": "chatcmpl-script", "object": "chat.completion", "created": int(time.time()),
            "model": "scripted", "choices": [{"index": 0, "message": message,
                                              "finish_reason": finish}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def scripted_app(seen: list[dict[str, Any]]) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        seen.append({**body, "x-aiops-priority": request.headers.get("x-aiops-priority")})
        tool_messages = [m for m in body["messages"] if m["role"] == "tool"]
        if not tool_messages:
            return _reply({"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function", "function": {
                    "name": "list_incidents", "arguments": json.dumps({"minutes": 15})}}]},
                "tool_calls")
        result = json.loads(tool_messages[-1]["content"])
        first = result["data"][0]
        return _reply({"role": "assistant", "content": (
            f"Incident {first['incident_id']}: {first['fault_class']} on "
            f"{first['service']}@{first['model_version']}.")}, "stop")

    return app
