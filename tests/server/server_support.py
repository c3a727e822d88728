"""What the server tests share besides fixtures (a module of its own: test modules must
not import `conftest`, whose name every test folder shares)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@dataclass
class Served:
    url: str
    apps: dict[str, Any]
    started: Any
    cancelled: Any

    def metrics(self) -> str:
        import httpx

        return httpx.get(f"{self.url}/metrics", headers=AUTH).text

    def openai(self, **options: Any) -> Any:
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, **{"max_retries": 0, **options})

    def async_openai(self, **options: Any) -> Any:
        import openai

        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, **{"max_retries": 0, **options})
