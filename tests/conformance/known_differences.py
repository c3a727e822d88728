"""Differences from the plain framework that are by design: test id -> why.

Each entry is also listed in README ("Conformance"). Keep this list short; an entry needs
a reason a user would accept.
"""

KNOWN: dict[str, dict[str, str]] = {
    "langchain": {},
    "langgraph": {},
    "llamaindex": {},
}
