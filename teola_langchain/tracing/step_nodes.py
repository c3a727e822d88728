"""The nodes of one step that is not a composite: a leaf call, a model, a retrieval.

- a leaf (prompt, parser, lambda, retriever Teola does not decompose, ...) is one call of
  its own `invoke`/`ainvoke`; a prompt's output also records where each of its variables
  comes from (`PromptPlan`), so prefill split can warm the ready start of the prompt
  while the rest is still computed;
- a chat model or LLM (or a binding around one) is PREFILL + DECODE on the model's
  engine; the decode calls the model's own `invoke`/`ainvoke` with the step's config;
- a retrieval over a proven store is EMBED + SEARCH of each query inside the retriever's
  own callback run (`components/retrievers.py`).
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable

from teola_core.ir.builder import Value
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.prompt import PromptPlan
from teola_core.passes.estimates import LATENCY_KEY
from teola_langchain.components.models import DEFAULT_MAX_TOKENS, language_model
from teola_langchain.components.prompts import describe, is_prompt
from teola_langchain.components.reads import reshapes_only
from teola_langchain.components.retrievers import Decomposition
from teola_langchain.execution import steps
from teola_langchain.execution.context import StepRef
from teola_langchain.execution.runs import streams_anyway
from teola_langchain.tracing.graph_writer import GraphWriter
from teola_langchain.tracing.values import MISSING, DictValue, Ref, Sym


class StepNodes(GraphWriter):
    """Adds the nodes of leaves, models and retrievals (see the module docstring)."""

    def leaf(self, r: Runnable[Any, Any], sym: Sym, ref: StepRef, reason: str | None) -> Sym:
        if reason is not None:
            self.session.note_opaque(r, reason)
        label = r.get_name()
        key = self.key(r, ref, "retriever" if isinstance(r, BaseRetriever) else "leaf", reason)
        out = self._user(steps.leaf(r, ref), {"value": self.whole(sym)}, "invoke", label, key, reshapes_only(r))
        return Ref(out, self._prompt_plan(r, sym) if is_prompt(r) else None)

    def _prompt_plan(self, prompt: Any, sym: Sym) -> PromptPlan | None:
        """Where each of the prompt's variables comes from, when its input is a dict built by the chain."""
        if not isinstance(sym, DictValue):
            return None
        template = describe(prompt)
        partials = set(prompt.partial_variables)
        sources = []
        for var in template.ports:
            if var in partials and var not in sym.fields:
                value = self.b.call(steps.constant(MISSING), {}, name="missing", inline=True)
            else:
                value = self.field(sym, var)
            sources.append((var, value.node, value.port))
        return PromptPlan(template, tuple(sources))

    def field(self, sym: DictValue, key: str) -> Value:
        """Where key `key` of the dict `sym` comes from (its value may be `MISSING` at run time)."""
        if key in sym.fields:
            return sym.fields[key]
        if sym.rest is not None:  # the key may come from a dict whose keys are known only at run time
            return self.b.call(steps.get_or_missing(key), {"value": sym.rest}, name="field", inline=True)
        return self.b.call(steps.constant(MISSING), {}, name="missing", inline=True)

    def model(self, r: Runnable[Any, Any], sym: Sym, ref: StepRef, unit: tuple[Any, int] | None = None) -> Any:
        """PREFILL + DECODE on the model's engine; with `unit` (split unit, expected items)
        the decode also yields its parsed items, for decode pipelining, and this returns
        (text, items) values instead of a `Ref`."""
        model = language_model(r)
        assert model is not None
        engine = self.session.engines.llm(model)
        max_tokens = getattr(model, "max_tokens", None)
        config: dict[str, Any] = {"step": steps.ModelStep(r, ref)}
        key = self.key(r, ref, "model")
        if isinstance(sym, Ref) and sym.plan is not None:
            config["prompt_plan"] = sym.plan
        label = r.get_name()
        prefill = self.b.add(
            PrimitiveKind.PREFILL,
            {"prompt": self.whole(sym)},
            engine=engine,
            name=f"{label}.prefill",
            label=label,
            config=config,
        )
        decode_config = {
            **config,
            "max_tokens": max_tokens if isinstance(max_tokens, int) else DEFAULT_MAX_TOKENS,
            LATENCY_KEY: key,
        }
        if unit is not None:
            decode_config.update(split_unit=unit[0], expected_items=unit[1])
            if isinstance(model, BaseChatModel) and not streams_anyway(r, model):
                self._block(
                    r,
                    ref,
                    "while a tracer or callbacks record the model's runs, its items go on only when it ends "
                    "(its streamed response can carry other metadata, such as token usage, than its plain one)",
                    "give the model streaming=True: plain LangChain then streams it too, and the traces stay equal",
                )
        decode = self.b.decode(
            prefill,
            engine=engine,
            name=f"{label}.decode",
            label=label,
            config=decode_config,
            splittable=unit is not None,
            items=None if unit is None else unit[1],
        )
        if unit is not None:
            return Value(decode.id, "text"), Value(decode.id, "items")
        return Ref(Value(decode.id, "text"))

    def _retrieve(self, r: BaseRetriever, plan: Decomposition, queries: Value, ref: StepRef, *, after: Value) -> Value:
        """EMBED + SEARCH of each query inside its own retriever run; item-wise, so it can pipeline."""
        label = r.get_name()
        key = self.key(r, ref, "retriever")
        embedder = self.session.engines.embeddings(plan.embeddings)
        store = self.session.engines.vectorstore(plan.store)
        started = self._itemwise(steps.start_retrievals(r, ref), {"items": queries, "after": after}, "start", label)
        texts = self._itemwise(steps.queries_of, {"items": started}, "queries", label, inline=True)
        index = self.b.call(steps.constant(plan.store), {}, name=f"{label}.index", inline=True)
        with self.b.module(label):
            vectors = self.b.embed(texts, engine=embedder, **{LATENCY_KEY: key})  # charged the retriever's run

            hits = self.b.search(vectors, index, engine=store, top_k=plan.top_k, search_kwargs=plan.search_kwargs)
        return self._itemwise(steps.end_retrievals, {"items": started, "hits": hits}, "end", label)
