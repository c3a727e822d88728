"""Response synthesizers as primitives: a plan, a FORMAT, the LLM call, or the original.

What `synthesize(query, nodes)` computes for the three classes decomposed here (the exact
classes, not streaming, no `output_cls`, no structured answer filtering, the default
program factory, an LLM that is no `StructuredLLM` and has no output parser):

- `CompactAndRefine` ("compact", `as_query_engine()`'s default): the nodes' LLM texts are
  repacked by the prompt helper into as few chunks as fit; then `Refine` over them.
- `Refine` ("refine"): the first chunk, repacked again to fit the QA template, is
  answered by `llm.predict(text_qa_template.partial_format(query_str=q),
  context_str=chunk)`; every further chunk (or piece of one) refines that answer with
  another LLM call whose prompt holds the previous answer.
- `SimpleSummarize` ("simple_summarize"): one `llm.predict(text_qa, context_str=
  truncated)` where `truncated` is the prompt helper's truncation of the joined texts
  (a list: the prompt holds its `str`, as LlamaIndex formats it).

Then `answer or "Empty Response"` becomes `Response(answer, source_nodes=nodes,
metadata={node_id: metadata})` (`_prepare_response_output`); with no nodes at all,
`Response("Empty Response")` and no LLM call.

Traced as:

    plan(nodes, query_str)        the synthesizer's own repack/truncate and the LLM's own
                                  `_get_prompt` (or `_get_messages` for a chat model):
                                  exactly one LLM call? its context and prompt
    FORMAT(query_str, context_str)  the prompt's segments (`formatting.predict_template`),
                                  so prefill split can prefill the part ready before the
                                  nodes (the literal head, and the question when the
                                  template puts it first)
    choose                        branch 0 iff the plan has one LLM call and the FORMAT
                                  renders exactly the plan's prompt (checked every query)
    PREFILL(prompt) -> [branch 0] DECODE -> Response      (the same `apredict` call)
                       [branch 1] the original `synthesize`/`asynthesize`, whole
    SELECT                        whichever branch ran

So "compact" and "simple_summarize" are one LLM primitive whenever the nodes fit one
prompt; "refine" is too when a single chunk remains (one node, or it fits). A refine
*chain* (several chunks) runs as the original synthesizer, one opaque call: each step's
prompt holds the previous answer and whether a step runs at all depends on the prompt
helper's budget for that answer, so the chain cannot be laid out before it runs. The
PREFILL stays outside the branches (a prefill of an opaque LLM is bookkeeping) so a split
prefill can start before the branch is known; only the DECODE waits for it. A chat model
(no text prompt to FORMAT) gets the same plan and branch with the plan's messages
(`achat`), without a prefill split. Every other synthesizer (tree_summarize, accumulate,
generation, ...) is the original call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llama_index.core.llms.structured_llm import StructuredLLM
from llama_index.core.response_synthesizers import CompactAndRefine, Refine, SimpleSummarize
from llama_index.core.schema import MetadataMode

from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.kinds import MergeMode, PortSpec, PrimitiveKind
from teola_core.ir.types import PortType
from teola_llamaindex.engines import EngineRegistry
from teola_llamaindex.formatting import predict_template

_CLASSES = (Refine, CompactAndRefine, SimpleSummarize)
_OPAQUE: dict[str, Any] = {"single": False, "context": None, "prompt": None}


def why_opaque(synthesizer: Any) -> str | None:
    """Why the synthesizer runs as one call (see the module docstring), or None."""
    cls = type(synthesizer)
    if cls not in _CLASSES:
        return f"{cls.__name__} is not decomposed"
    if synthesizer._streaming:
        return "streaming"
    llm = synthesizer._llm
    if isinstance(llm, StructuredLLM) or getattr(llm, "output_parser", None) is not None:
        return "a structured LLM or an LLM output parser"
    if getattr(synthesizer, "_output_cls", None) is not None:
        return "output_cls"
    if cls is not SimpleSummarize:
        if synthesizer._structured_answer_filtering:
            return "structured answer filtering"
        factory = synthesizer._program_factory
        if (
            getattr(factory, "__func__", None) is not Refine._default_program_factory
            or factory.__self__ is not synthesizer
        ):
            return "a custom program factory"
    return None


def max_tokens_hint(llm: Any) -> int:
    """A planning hint only (results never depend on it): the LLM's declared output length."""
    num_output = getattr(llm.metadata, "num_output", -1)
    return num_output if isinstance(num_output, int) and num_output > 0 else 256


def trace_synthesis(
    b: GraphBuilder,
    engines: EngineRegistry,
    synthesizer: Any,
    query_str: Value,
    nodes: Value,
    original: Callable[[], Value],
) -> Value:
    """The Response of `synthesizer` for `query_str` and `nodes` (see the module docstring).

    `original()` adds, inside the opaque branch, the call that runs the synthesizer as is
    (it must return the Response's Value). Call only when `why_opaque` is None.
    """
    llm = synthesizer._llm
    chat = bool(llm.metadata.is_chat_model)
    template = None if chat else predict_template(synthesizer._text_qa_template, llm, ("query_str", "context_str"))
    planned = b.call(
        _plan(synthesizer, chat), {"nodes": nodes, "query_str": query_str}, outputs=("single", "context", "prompt")
    )
    engine = engines.llm(llm)
    prompt = b.call_outputs(planned, "prompt")
    if template is not None:
        prompt = b.format(template, query_str=query_str, context_str=b.call_outputs(planned, "context"))
        expected = b.call_outputs(planned, "prompt")
        check = b.call(
            _same_prompt, {"single": planned, "rendered": prompt, "expected": expected}, name="check", inline=True
        )
    else:
        check = b.call(_single, {"single": planned}, name="check", inline=True)
    choose = b.add(
        PrimitiveKind.CONDITION,
        {"value": check},
        config={"predicate": _index, "branches": 2, "inline": True},
        name="choose",
    )
    branch = Value(choose.id, "branch")
    api = "chat" if chat else "predict"

    def decode_and_finish(prefill: Any) -> Value:
        decode = b.add(
            PrimitiveKind.DECODE,
            {"kv": Value(prefill.id, "kv")},
            engine=engine,
            config={"max_tokens": max_tokens_hint(llm), "api": api},
            output_ports=(PortSpec("text", PortType.TEXT),),
            name="llm.decode",
        )
        return b.call(
            _finish(synthesizer), {"text": Value(decode.id, "text"), "nodes": nodes}, name="response", inline=True
        )

    if template is not None:  # the prefill outside the branch: a split prefill may start early
        prefill = b.add(PrimitiveKind.PREFILL, {"prompt": prompt}, engine=engine, name="llm.prefill")
        with b.branch(branch, 0):
            single = decode_and_finish(prefill)
    else:
        with b.branch(branch, 0):
            single = decode_and_finish(
                b.add(PrimitiveKind.PREFILL, {"prompt": prompt}, engine=engine, name="llm.prefill")
            )
    with b.branch(branch, 1):
        whole = original()
    return b.aggregate([single, whole], MergeMode.SELECT)


def _plan(synthesizer: Any, chat: bool) -> Callable[..., dict[str, Any]]:
    """One LLM call or not, its context and its prompt, as the synthesizer computes them."""
    llm = synthesizer._llm

    def plan(nodes: list[Any], query_str: str) -> dict[str, Any]:
        # checked again per query: the user may have changed the synthesizer since tracing
        if len(nodes) == 0 or why_opaque(synthesizer) is not None or bool(llm.metadata.is_chat_model) != chat:
            return _OPAQUE
        texts = [n.node.get_content(metadata_mode=MetadataMode.LLM) for n in nodes]
        template = synthesizer._text_qa_template.partial_format(query_str=query_str)
        helper = synthesizer._prompt_helper
        context: Any
        if type(synthesizer) is SimpleSummarize:
            context = helper.truncate(prompt=template, text_chunks=["\n".join(texts)], llm=llm)
        else:
            if type(synthesizer) is CompactAndRefine:
                texts = synthesizer._make_compact_text_chunks(query_str, texts)
            if len(texts) != 1:
                return _OPAQUE
            pieces = helper.repack(template, [texts[0]], llm=llm)
            if len(pieces) != 1:
                return _OPAQUE
            context = pieces[0]
        prompt = (
            llm._get_messages(template, context_str=context) if chat else llm._get_prompt(template, context_str=context)
        )
        return {"single": True, "context": context, "prompt": prompt}

    return plan


def _same_prompt(single: bool, rendered: str, expected: Any) -> bool:
    return single and rendered == expected


def _single(single: bool) -> bool:
    return single


def _index(one_call: bool) -> int:
    return 0 if one_call else 1


def _finish(synthesizer: Any) -> Callable[..., Any]:
    """`answer or "Empty Response"` as the Response `synthesize` returns."""

    def finish(text: str, nodes: list[Any]) -> Any:
        return synthesizer._prepare_response_output(text or "Empty Response", list(nodes))

    return finish
