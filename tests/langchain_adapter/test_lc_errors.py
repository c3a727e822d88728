"""Errors: a failing step raises what LangChain raises, named; other queries of a batch finish."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnableBranch, RunnableLambda, RunnablePassthrough
from lc_fakes import EchoChat

from teola_core.ir.errors import PrimitiveError
from teola_langchain import optimize


class Boom(Exception):
    pass


def explode_on_three(x: int) -> int:
    if x == 3:
        raise Boom(f"no threes ({x})")
    return x * 10


def raised(fn: Any) -> BaseException:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


def both(chain: Runnable[Any, Any], call: Any) -> tuple[BaseException, BaseException]:
    fast = optimize(chain, execution="graph")
    try:
        return raised(lambda: call(chain)), raised(lambda: call(fast))
    finally:
        fast.close()


def test_step_exception_is_the_users_own_unchanged() -> None:
    chain = RunnableLambda(lambda x: x + 2) | RunnableLambda(explode_on_three, name="explode_on_three")
    expected, got = both(chain, lambda r: r.invoke(1))
    assert type(got) is Boom and not isinstance(got, PrimitiveError)
    assert str(got) == str(expected)
    assert getattr(got, "__notes__", None) == getattr(expected, "__notes__", None)


def test_async_exception_matches() -> None:
    chain = RunnableLambda(lambda x: x + 2) | RunnableLambda(explode_on_three)
    expected, got = both(chain, lambda r: asyncio.run(r.ainvoke(1)))
    assert type(got) is type(expected) is Boom


def test_missing_prompt_variable_raises_keyerror_like_langchain() -> None:
    chain = ChatPromptTemplate.from_template("{a} and {b}") | EchoChat()
    expected, got = both(chain, lambda r: r.invoke({"a": 1}))
    assert type(got) is type(expected) is KeyError
    assert "missing variables {'b'}" in str(got)


def test_non_dict_into_multi_variable_prompt_raises_typeerror() -> None:
    chain = RunnableLambda(lambda x: x) | ChatPromptTemplate.from_template("{a} and {b}")
    expected, got = both(chain, lambda r: r.invoke("not a dict"))
    assert type(got) is type(expected) is TypeError


def test_assign_on_non_dict_raises_valueerror() -> None:
    chain = RunnableLambda(lambda x: x) | RunnablePassthrough.assign(y=lambda d: 1)
    expected, got = both(chain, lambda r: r.invoke(5))
    assert type(got) is type(expected) is ValueError
    assert str(got) == str(expected)


def test_error_in_a_map_element() -> None:
    chain = RunnableLambda(lambda n: list(range(n))) | RunnableLambda(explode_on_three).map()
    expected, got = both(chain, lambda r: r.invoke(5))
    assert type(got) is type(expected) is Boom


def test_error_in_a_branch_condition() -> None:
    chain = RunnableBranch((lambda x: 1 / x > 0, RunnableLambda(lambda x: x)), RunnablePassthrough())
    expected, got = both(chain, lambda r: r.invoke(0))
    assert type(got) is type(expected) is ZeroDivisionError


@pytest.mark.parametrize("backend", ["reference", "local"])
def test_batch_failures_in_place_and_others_finish(backend: str) -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def record(x: int) -> int:
        with lock:
            seen.append(x)
        return x

    chain = RunnableLambda(record) | RunnableLambda(explode_on_three)
    fast = optimize(chain, backend=backend)
    inputs = [1, 2, 3, 4, 5]
    expected = chain.batch(inputs, return_exceptions=True)
    seen.clear()
    got = fast.batch(inputs, return_exceptions=True)
    assert sorted(seen) == inputs
    assert [type(r) for r in got] == [type(r) for r in expected]
    assert got[:2] == expected[:2] and got[3:] == expected[3:]
    agot = asyncio.run(fast.abatch(inputs, return_exceptions=True))
    assert [type(r) for r in agot] == [type(r) for r in expected]

    seen.clear()
    with pytest.raises(Boom):
        fast.batch(inputs)
    assert sorted(seen) == inputs  # the other inputs still ran to the end
    with pytest.raises(Boom):
        asyncio.run(fast.abatch(inputs))
    fast.close()


@pytest.mark.parametrize("value", [42, "a chain?", None])
def test_optimize_says_what_it_takes_when_given_something_else(value: Any) -> None:
    import teola

    with pytest.raises(TypeError, match=f"takes a LangChain runnable.*got {type(value).__name__}"):
        teola.optimize(value)
