"""LlamaIndex clients for the simulated OpenAI-compatible servers (`teola_adapters.simulated.servers`).

Minimal `CustomLLM` / `BaseEmbedding` subclasses over the `openai` client, not
llama-index's `OpenAILike` / `OpenAIEmbedding`: those integration packages pin
llama-index-core versions of their own, while these work on both lines with only
`openai` installed. They speak the same endpoints (`/v1/completions`,
`/v1/embeddings`), so the server sees what the real clients would send.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import (
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    CustomLLM,
    LLMMetadata,
)
from openai import AsyncOpenAI, OpenAI
from pydantic import PrivateAttr


def _clients(base_url: str) -> tuple[OpenAI, AsyncOpenAI]:
    """The sync and async clients of a simulated server: no key, no retries (a failure shows at once)."""
    settings: dict[str, Any] = {"base_url": base_url, "api_key": "x", "max_retries": 0}
    return OpenAI(**settings), AsyncOpenAI(**settings)


class ServerLLM(CustomLLM):
    """A completion model on `base_url` (`/v1/completions`, temperature 0)."""

    base_url: str
    model: str = "sim-7b"
    max_tokens: int = 256
    _client: OpenAI = PrivateAttr()
    _aclient: AsyncOpenAI = PrivateAttr()

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        self._client, self._aclient = _clients(self.base_url)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name=self.model, num_output=self.max_tokens, is_chat_model=False)

    def _args(self, prompt: str) -> dict[str, Any]:
        return {"model": self.model, "prompt": prompt, "max_tokens": self.max_tokens, "temperature": 0}

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=self._client.completions.create(**self._args(prompt)).choices[0].text)

    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        reply = await self._aclient.completions.create(**self._args(prompt))
        return CompletionResponse(text=reply.choices[0].text)

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        text = ""
        for chunk in self._client.completions.create(**self._args(prompt), stream=True):
            delta = chunk.choices[0].text if chunk.choices else ""
            text += delta
            yield CompletionResponse(text=text, delta=delta)

    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        stream = await self._aclient.completions.create(**self._args(prompt), stream=True)

        async def gen() -> CompletionResponseAsyncGen:
            text = ""
            async for chunk in stream:
                delta = chunk.choices[0].text if chunk.choices else ""
                text += delta
                yield CompletionResponse(text=text, delta=delta)

        return gen()


class ServerEmbedding(BaseEmbedding):
    """An embedding model on `base_url` (`/v1/embeddings`, float vectors)."""

    base_url: str
    model: str = "sim-embed"
    _client: OpenAI = PrivateAttr()
    _aclient: AsyncOpenAI = PrivateAttr()

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        self._client, self._aclient = _clients(self.base_url)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        reply = self._client.embeddings.create(model=self.model, input=texts, encoding_format="float")
        return [d.embedding for d in reply.data]

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        reply = await self._aclient.embeddings.create(model=self.model, input=texts, encoding_format="float")
        return [d.embedding for d in reply.data]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embeddings([text])[0]

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return (await self._aget_text_embeddings([text]))[0]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._get_text_embedding(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return await self._aget_text_embedding(query)
