"""Example LangChain apps that `teola.optimize` speeds up (installed as `teola_examples`).

Each module builds a chain a LangChain user would write — `build_chain(llm, embeddings,
...)` — and runs it plain and optimized when executed (`python -m teola_examples.<name>`),
against simulated OpenAI-compatible servers on 127.0.0.1 unless `OPENAI_BASE_URL` is set.
"""
