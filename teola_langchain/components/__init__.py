"""The LangChain components Teola recognises, and what it proves about them.

Recognised by exact class (`classes.py`, `patched.py`): models (`models.py`), prompts
(`prompts.py`), output parsers (`parsers.py`), retrievers (`retrievers.py`,
`multi_query.py`). Proven from a step's own code, never from names: the keys it reads
(`reads.py`) and the list slice it keeps (`slices.py`).
"""
