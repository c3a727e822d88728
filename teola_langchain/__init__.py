"""LangChain adapter: trace an LCEL chain into Teola graphs and run it as a drop-in runnable.

    from teola_langchain import optimize
    fast = optimize(chain)
    fast.invoke(x) == chain.invoke(x)

Needs `langchain-core` (`pip install 'teola[langchain]'`).
"""

from teola_langchain.parsers import LineListOutputParser
from teola_langchain.runnable import TeolaRunnable, optimize
from teola_langchain.tracer import OpaqueStepWarning, TracedChain, trace

__all__ = ["LineListOutputParser", "OpaqueStepWarning", "TeolaRunnable", "TracedChain", "optimize", "trace"]
