"""LangGraph benchmarks: example graphs on simulated OpenAI-compatible servers, plain vs `teola.optimize`."""
