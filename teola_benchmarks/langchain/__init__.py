"""LangChain benchmarks: example chains on simulated OpenAI-compatible servers, plain vs `teola.optimize`."""
